"""A tiny WorkerService on a real port, for the worker's client-side behaviour.

It is not the server: it hands out the jobs a test queues, answers heartbeats as
the test says (lost, cancel requested), records every call, and fails the calls
a test tells it to with the status the test names. Tests wait on its `until`,
never on sleeps.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf import any_pb2, struct_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from leasehold.v1 import jobs_pb2, worker_pb2, worker_pb2_grpc
from leasehold.worker import HandlerRegistry, Worker

TOKEN = "test-worker-token-0123456789"
# Long enough that a slow CI machine never sees a lease lapse by accident; the
# heartbeat interval, not the lease, sets the pace of these tests.
LEASE_SECONDS = 60.0
WAIT_TIMEOUT_SECONDS = 10.0


@dataclass
class Call:
    method: str
    request: Any
    metadata: dict[str, str]


@dataclass
class FakeWorkerService(worker_pb2_grpc.WorkerServiceServicer):  # type: ignore[misc]
    heartbeat_interval_seconds: float = 0.05
    protocol_version: int = 1
    calls: list[Call] = field(default_factory=list)
    queued: list[worker_pb2.ClaimedJob] = field(default_factory=list)
    # job ids the next heartbeat reports lost / cancel requested
    lost: set[str] = field(default_factory=set)
    cancel_requested: set[str] = field(default_factory=set)
    # method name -> the status code its next calls fail with, and how many times
    failures: dict[str, tuple[grpc.StatusCode, int]] = field(default_factory=dict)
    bad_request_field: str = "result"
    abandoned_claims: int = 0
    features: tuple[str, ...] = ("results", "snooze")
    # When set, a Complete is answered only once this is set.
    complete_answers: asyncio.Event | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _notifier: asyncio.Task[None] | None = None

    # ----- what tests use ---------------------------------------------------------

    async def enqueue(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        timeout_seconds: int = 60,
        checkpoint: dict[str, Any] | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> str:
        job_id = f"job-{uuid.uuid4().hex[:8]}"
        self.queued.append(
            worker_pb2.ClaimedJob(
                job=jobs_pb2.Job(
                    id=job_id,
                    kind=kind,
                    status=jobs_pb2.JOB_STATUS_RUNNING,
                    attempt=1,
                    max_attempts=3,
                    timeout_seconds=timeout_seconds,
                ),
                payload=_struct(payload or {}),
                owner_id="owner-1",
                lease_token=f"token-{job_id}",
                lease_expires_at=_stamp(lease_seconds),
                heartbeat_interval_seconds=self.heartbeat_interval_seconds,
                checkpoint=None if checkpoint is None else _struct(checkpoint),
            )
        )
        await self._notify()
        return job_id

    def fail_next(self, method: str, code: grpc.StatusCode, times: int = 1) -> None:
        self.failures[method] = (code, times)

    def named(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    def writes(self) -> list[Call]:
        """Every call that changes a job: what a fenced-out worker must not send."""
        return [call for call in self.calls if call.method not in {"Claim", "Heartbeat", "GetServerInfo"}]

    async def until(self, predicate: Callable[[], bool], timeout: float = WAIT_TIMEOUT_SECONDS) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    # ----- the service --------------------------------------------------------------

    async def Claim(self, request: worker_pb2.ClaimRequest, context: grpc.aio.ServicerContext) -> Any:
        await self._record("Claim", request, context)
        try:
            async with asyncio.timeout(request.wait_seconds), self._changed:
                await self._changed.wait_for(lambda: bool(self.queued))
        except TimeoutError:
            return worker_pb2.ClaimResponse()
        except asyncio.CancelledError:
            self.abandoned_claims += 1  # the client gave up: it takes no job with it
            self._notifier = asyncio.get_running_loop().create_task(self._notify())
            raise
        taken, self.queued = self.queued[: request.max_jobs], self.queued[request.max_jobs :]
        return worker_pb2.ClaimResponse(jobs=taken)

    async def Heartbeat(self, request: worker_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext) -> Any:
        await self._record("Heartbeat", request, context)
        states = []
        for lease in request.leases:
            lost = lease.job_id in self.lost
            states.append(
                worker_pb2.LeaseState(
                    job_id=lease.job_id,
                    lease_expires_at=None if lost else _stamp(LEASE_SECONDS),
                    cancel_requested=lease.job_id in self.cancel_requested,
                    lost=lost,
                )
            )
        return worker_pb2.HeartbeatResponse(states=states)

    async def AppendEvent(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._record("AppendEvent", request, context)
        return worker_pb2.AppendEventResponse(sequence=len(self.named("AppendEvent")))

    async def Complete(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._record("Complete", request, context)
        if self.complete_answers is not None:
            await self.complete_answers.wait()
        status = jobs_pb2.JOB_STATUS_CANCELLED if request.job_id in self.cancel_requested else None
        return worker_pb2.CompleteResponse(
            job=self._job(request.job_id, status or jobs_pb2.JOB_STATUS_SUCCEEDED)
        )

    async def Fail(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._record("Fail", request, context)
        return worker_pb2.FailResponse(job=self._job(request.job_id, jobs_pb2.JOB_STATUS_QUEUED))

    async def Snooze(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._record("Snooze", request, context)
        return worker_pb2.SnoozeResponse(job=self._job(request.job_id, jobs_pb2.JOB_STATUS_QUEUED))

    async def ConfirmCancel(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._record("ConfirmCancel", request, context)
        return worker_pb2.ConfirmCancelResponse(job=self._job(request.job_id, jobs_pb2.JOB_STATUS_CANCELLED))

    async def GetServerInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._record("GetServerInfo", request, context)
        return worker_pb2.GetServerInfoResponse(
            server_version="fake", protocol_version=self.protocol_version, features=self.features
        )

    async def _record(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        metadata = {
            key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)
        }
        self.calls.append(Call(method, request, metadata))
        await self._notify()
        if metadata.get("authorization") != f"Bearer {TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "worker token missing or wrong")
        code, times = self.failures.get(method, (grpc.StatusCode.OK, 0))
        if times > 0:
            self.failures[method] = (code, times - 1)
            await self._abort(code, context)

    async def _abort(self, code: grpc.StatusCode, context: grpc.aio.ServicerContext) -> None:
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            violation = error_details_pb2.BadRequest.FieldViolation(
                field=self.bad_request_field, description="is too large"
            )
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
            status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="bad", details=[detail])
            await context.abort_with_status(rpc_status.to_status(status))
        await context.abort(code, f"told to fail with {code.name}")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    @staticmethod
    def _job(job_id: str, status: int) -> jobs_pb2.Job:
        return jobs_pb2.Job(id=job_id, status=status, attempt=1)  # type: ignore[arg-type]


@asynccontextmanager
async def fake_server(
    service: FakeWorkerService | None = None,
) -> AsyncIterator[tuple[FakeWorkerService, str]]:
    """The service on a real localhost port; yields it and its HOST:PORT."""
    service = service or FakeWorkerService()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield service, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct


def _stamp(seconds_from_now: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(datetime.now(UTC) + timedelta(seconds=seconds_from_now))
    return stamp


@asynccontextmanager
async def running_worker(address: str, registry: HandlerRegistry, **options: Any) -> AsyncIterator[Worker]:
    """A Worker running against `address` for the block; stopped (gracefully) after."""
    options.setdefault("stop_grace_seconds", 0.0)
    worker = Worker(address, registry, TOKEN, **options)
    run = asyncio.create_task(worker.run(), name="test-worker")
    try:
        yield worker
    finally:
        await worker.stop()
        await run

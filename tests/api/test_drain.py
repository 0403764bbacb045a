"""The drain (DESIGN §13) in process, on a real port: what each caller sees
between the start of `LeaseholdApp.stop()` and the listener closing. The
subprocess test (tests/system/test_drain.py) adds the signal, the exit status
and the next server."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.api.helpers import WAIT, error_info, expect_error, get_job, start_gate_job
from tests.database_reads import scalar
from tests.support import OWNER, Gate, owner_metadata, sqlite_url, test_registry

TOKEN = secrets.token_urlsafe(24)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SERVICES = ("", "leasehold.v1.JobService", "leasehold.v1.WorkerService", "leasehold.v1.ScheduleService")
GRACE = 30.0  # far longer than any step here: the drain must end when the handler does


@pytest.fixture
async def service(tmp_path: Path, gate: Gate) -> AsyncIterator[LeaseholdApp]:
    settings = Settings(
        database_url=sqlite_url(tmp_path, "drain.db"),
        listen="127.0.0.1:0",
        runtime=RuntimeSettings(concurrency=4, lease_seconds=6, poll_seconds=5),
        remote_kinds=("remote.*",),
        worker_token=TOKEN,
    )
    app = LeaseholdApp(settings, clock=SystemClock(), registry=test_registry(gate))
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace_seconds=0)  # a test that failed half-way; otherwise already stopped


async def _until(probe: object, what: str) -> None:
    assert callable(probe)
    async with asyncio.timeout(WAIT):
        while not probe():
            await asyncio.sleep(0.01)  # a server-side count has no event to wait on


async def _health(channel: grpc.aio.Channel, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return (await health_pb2_grpc.HealthStub(channel).Check(request)).status


async def test_during_the_drain_health_is_not_serving_unary_calls_are_served_and_watches_end_unavailable(
    service: LeaseholdApp, gate: Gate
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        for name in SERVICES:
            assert await _health(channel, name) == health_pb2.HealthCheckResponse.SERVING
        job = await start_gate_job(stub)
        watch = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job.id), metadata=owner_metadata(OWNER))
        seen = [(await watch.read()).event for _ in range(2)]  # job.queued, job.started: now live
        assert [event.type for event in seen] == ["job.queued", "job.started"]

        stopping = asyncio.create_task(service.stop(grace_seconds=GRACE))
        err = await expect_error(watch.read(), grpc.StatusCode.UNAVAILABLE)
        assert error_info(err).reason == "SERVER_DRAINING"
        assert "after_sequence" in err.details()

        # The gate job still runs, so the listener is open: health answers, for every service.
        for name in SERVICES:
            assert await _health(channel, name) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert (await get_job(stub, job.id)).status == jobs_pb2.JOB_STATUS_RUNNING  # unary: served
        again = stub.WatchEvents(
            jobs_pb2.WatchEventsRequest(job_id=job.id, after_sequence=seen[-1].sequence),
            metadata=owner_metadata(OWNER),
        )
        await expect_error(again.read(), grpc.StatusCode.UNAVAILABLE)  # new streams go elsewhere
        assert not stopping.done()

        gate.release.set()  # the handler finishes within its grace: the drain ends with it
        # WAIT is half the grace: a drain that ended by the grace would time out here.
        await asyncio.wait_for(stopping, WAIT)
        assert service.watch_streams.open == 0
    # It finished within the grace, not handed back (queued again) when the grace ran out.
    assert scalar(service.settings.database_url, "SELECT status FROM jobs WHERE id = :id", id=job.id) == (
        "succeeded"
    )


async def test_a_waiting_claim_returns_empty_at_once_and_a_new_claim_is_unavailable(
    service: LeaseholdApp,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        worker = worker_pb2_grpc.WorkerServiceStub(channel)
        request = worker_pb2.ClaimRequest(worker_id="w", kinds=["remote.work"], wait_seconds=60)
        waiting = asyncio.ensure_future(worker.Claim(request, metadata=AUTH))
        assert service.claimer is not None
        claimer = service.claimer
        await _until(lambda: claimer.waiting == 1, "the Claim to wait for work")

        service.claimer.drain()  # what stop() does first; the listener stays open meanwhile
        # Ended by the drain: WAIT is a quarter of the 60 s the Claim asked, and the safety-net
        # poll (5 s) only looks again and goes back to sleep, it never returns an empty Claim.
        assert list((await asyncio.wait_for(waiting, WAIT)).jobs) == []
        assert claimer.waiting == 0
        err = await expect_error(worker.Claim(request, metadata=AUTH), grpc.StatusCode.UNAVAILABLE)
        assert error_info(err).reason == "SERVER_DRAINING"
    await asyncio.wait_for(service.stop(grace_seconds=GRACE), WAIT)  # idle: at once

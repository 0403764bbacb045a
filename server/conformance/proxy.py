"""A WorkerService proxy between the worker under test and the real server.

Every call is forwarded as raw bytes, so the proxy cannot change what it does
not mean to; it decodes a copy of each request and answer only to record what
the worker did (`Call`), and rewrites a message only where a rule plays a trick:
a claimed job's lease shortened (`shorten_lease`), a finishing write's answer
lost (`lose_finish_answer`). Rules then wait on the record (`wait_for`) instead
of sleeping a guessed amount.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf.message import Message

from leasehold.v1 import worker_pb2

SERVICE = "leasehold.v1.WorkerService"
# Each method's request and answer types, for the record.
METHODS: dict[str, tuple[type[Message], type[Message]]] = {
    "Claim": (worker_pb2.ClaimRequest, worker_pb2.ClaimResponse),
    "Heartbeat": (worker_pb2.HeartbeatRequest, worker_pb2.HeartbeatResponse),
    "AppendEvent": (worker_pb2.AppendEventRequest, worker_pb2.AppendEventResponse),
    "Complete": (worker_pb2.CompleteRequest, worker_pb2.CompleteResponse),
    "Fail": (worker_pb2.FailRequest, worker_pb2.FailResponse),
    "Snooze": (worker_pb2.SnoozeRequest, worker_pb2.SnoozeResponse),
    "ConfirmCancel": (worker_pb2.ConfirmCancelRequest, worker_pb2.ConfirmCancelResponse),
    "Finish": (worker_pb2.FinishRequest, worker_pb2.FinishResponse),
    "GetServerInfo": (worker_pb2.GetServerInfoRequest, worker_pb2.GetServerInfoResponse),
}
FINISHING = frozenset({"Complete", "Fail", "Snooze", "ConfirmCancel"})
# A Finish outcome's field, by the single call it stands for.
OUTCOME_METHODS = {
    "complete": "Complete",
    "fail": "Fail",
    "snooze": "Snooze",
    "confirm_cancel": "ConfirmCancel",
}
# A call the worker made without a deadline still ends: a Claim waits at most
# 60 s on the server.
DEFAULT_FORWARD_TIMEOUT_SECONDS = 90.0


@dataclass
class Call:
    """One call the worker made, as the proxy saw it. Times are `time.monotonic()`."""

    method: str
    request: Any
    received_at: float
    answered_at: float | None = None
    response: Any = None
    # The status the worker got, and what the server answered when the two
    # differ (a trick).
    code: grpc.StatusCode = grpc.StatusCode.OK
    upstream_code: grpc.StatusCode | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FinishingWrite:
    """One finishing write, whether its own call or one outcome of a Finish."""

    call: Call
    method: str  # Complete, Fail, Snooze or ConfirmCancel
    job_id: str
    lease_token: str
    # Whether the worker was answered that the write took effect (a Finish
    # answers each outcome on its own: `lost` or `invalid` are not).
    answered_ok: bool


def finishing_writes(call: Call) -> list[FinishingWrite]:
    """The finishing writes `call` carries, whatever the call."""
    ok = call.answered_at is not None and call.code is grpc.StatusCode.OK
    if call.method in FINISHING:
        request = call.request
        return [FinishingWrite(call, call.method, request.job_id, request.lease_token, ok)]
    if call.method != "Finish":
        return []
    results = list(call.response.results) if ok and call.response is not None else []
    writes = []
    for index, outcome in enumerate(call.request.outcomes):
        field_name = outcome.WhichOneof("outcome")
        if field_name is None:
            continue
        inner = getattr(outcome, field_name)
        took = index < len(results) and results[index].HasField("job")
        writes.append(
            FinishingWrite(call, OUTCOME_METHODS[field_name], inner.job_id, inner.lease_token, ok and took)
        )
    return writes


def names_lease(call: Call, job_id: str, lease_token: str) -> bool:
    """Whether a Heartbeat names that attempt. A lease is its job id and token
    together: the jobs of one Claim share the claim's token."""
    return any(lease.job_id == job_id and lease.lease_token == lease_token for lease in call.request.leases)


@dataclass
class _ShortLease:
    job_id: str
    seconds: float
    # Filled in when played: the lease token and the expiry the worker was told.
    lease_token: str = ""
    told_expiry: float | None = None


class WorkerServiceProxy(grpc.GenericRpcHandler):
    """Forwards WorkerService to `upstream`; see the module docstring."""

    def __init__(self, upstream: str) -> None:
        self.calls: list[Call] = []
        self._upstream = upstream
        self._channel = grpc.aio.insecure_channel(upstream)
        self._changed = asyncio.Event()
        self._short_leases: dict[str, _ShortLease] = {}
        self._lost_answers: set[str] = set()
        self._server: grpc.aio.Server | None = None

    # ----- lifecycle -------------------------------------------------------------

    async def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((self,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0)
        await self._channel.close()

    async def reconnect(self) -> None:
        """A new channel to the same address: after the server restarted, so
        that no reconnect backoff of the old one delays the worker's calls."""
        old, self._channel = self._channel, grpc.aio.insecure_channel(self._upstream)
        await old.close()

    # ----- tricks --------------------------------------------------------------------

    def shorten_lease(self, job_id: str, seconds: float) -> None:
        """The next Claim answer handing out `job_id` says its lease ends
        `seconds` from now (the server's lease is not touched)."""
        self._short_leases[job_id] = _ShortLease(job_id, seconds)

    def short_lease_told(self, job_id: str) -> tuple[str, float] | None:
        """(lease token, monotonic expiry told) once the trick was played."""
        trick = self._short_leases.get(job_id)
        if trick is None or trick.told_expiry is None:
            return None
        return trick.lease_token, trick.told_expiry

    def lose_finish_answer(self, job_id: str) -> None:
        """The next finishing write for `job_id` reaches the server, but the
        worker is answered UNAVAILABLE, as if the answer were lost on the way."""
        self._lost_answers.add(job_id)

    # ----- the record ----------------------------------------------------------------

    async def wait_for(self, found: Callable[[], Any], timeout: float) -> Any:
        """`found()`'s first truthy value, checked after each recorded call, or
        None once `timeout` seconds have passed without one."""
        deadline = time.monotonic() + timeout
        while True:
            value = found()
            if value:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._changed.clear()
            try:
                async with asyncio.timeout(min(left, 0.25)):
                    await self._changed.wait()
            except TimeoutError:
                pass

    def of(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    # ----- forwarding ----------------------------------------------------------------

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        service, _, method = handler_call_details.method.lstrip("/").partition("/")
        if service != SERVICE or method not in METHODS:
            return None

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self._forward(method, request, context)

        return grpc.unary_unary_rpc_method_handler(forward)

    async def _forward(self, method: str, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request_type, response_type = METHODS[method]
        call = Call(method, request_type.FromString(raw), time.monotonic())
        self.calls.append(call)
        self._notify()
        metadata = tuple(
            (key, value) for key, value in context.invocation_metadata() or () if not key.startswith(":")
        )
        remaining = context.time_remaining()
        timeout = DEFAULT_FORWARD_TIMEOUT_SECONDS if remaining is None else max(remaining, 0.001)
        stub = self._channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            answer: bytes = await stub(raw, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            call.code = exc.code()
            call.answered_at = time.monotonic()
            self._notify()
            trailing = exc.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))
            await context.abort(exc.code(), exc.details() or "")
        call.response = response_type.FromString(answer)
        answer = self._play(call, answer)
        call.answered_at = time.monotonic()
        self._notify()
        if call.code is not grpc.StatusCode.OK:
            await context.abort(call.code, "the conformance proxy lost this answer on purpose")
        return answer

    def _play(self, call: Call, answer: bytes) -> bytes:
        """The tricks on an answer the server gave; returns the bytes to send."""
        if call.method == "Claim":
            return self._shorten(call, answer)
        for write in finishing_writes(call):
            if write.job_id in self._lost_answers:
                # The whole call's answer is lost, as on a broken connection
                # (a Finish's other outcomes with it: retrying them is safe).
                self._lost_answers.discard(write.job_id)
                call.upstream_code, call.code = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE
                call.notes.append("answer lost")
                break
        return answer

    def _shorten(self, call: Call, answer: bytes) -> bytes:
        response: worker_pb2.ClaimResponse = call.response
        played = False
        for claimed in response.jobs:
            trick = self._short_leases.get(claimed.job.id)
            if trick is None or trick.told_expiry is not None:
                continue
            claimed.lease_expires_at.FromDatetime(datetime.now(UTC) + timedelta(seconds=trick.seconds))
            trick.lease_token = claimed.lease_token
            trick.told_expiry = time.monotonic() + trick.seconds
            call.notes.append(f"lease of {claimed.job.id} shortened to {trick.seconds:g} s")
            played = True
        return response.SerializeToString() if played else answer

    def _notify(self) -> None:
        self._changed.set()

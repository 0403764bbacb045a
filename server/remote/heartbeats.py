"""One heartbeat loop per worker process, renewing every held lease in one call.

A worker running a hundred jobs sends one `Heartbeat` RPC per interval, not a
hundred. The executor still asks its store to `renew()` each lease on its own
timer, as in-process; the remote store answers from what the last batched reply
said (`LeaseBook.renewed`), with no call of its own. The same reply carries each
job's `cancel_requested`, which is how a cancel reaches `ctx.raise_if_cancelled()`
without a call per check, and `lost`, which makes the next `renew()` raise
LeaseLost so the executor stops the handler.

A checkpoint (`ctx.checkpoint`) is the one thing sent at once rather than with
the next beat: a Heartbeat naming only that lease and carrying it, so that when
the handler's `await` returns the server has stored it, and a worker killed a
moment later loses nothing it was told was saved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import structlog

from leasehold._server.api.convert import dict_to_struct
from leasehold._server.clock import Clock
from leasehold._server.jobs.errors import LeaseLost, StorageUnavailable
from leasehold._server.jobs.records import ClaimedJob, JsonObject, Lease, LeaseRenewal
from leasehold._server.remote.calls import mapped
from leasehold._server.runtime.asyncio_helpers import cancel_and_wait
from leasehold.v1 import worker_pb2

log = structlog.get_logger("leasehold.worker")

# The most leases one Heartbeat may carry (worker.proto); Worker keeps its
# concurrency within it, so one call always carries them all.
MAX_LEASES_PER_HEARTBEAT = 1000
# A beat gets at least this long to answer, so a short interval on a busy
# server does not turn every beat into a timeout.
MIN_BEAT_TIMEOUT_SECONDS = 1.0

SendHeartbeat = Callable[[worker_pb2.HeartbeatRequest, float], Awaitable[worker_pb2.HeartbeatResponse]]


class CheckpointsUnsupported(RuntimeError):
    """`ctx.checkpoint` on a worker whose server would not store it: an older
    server ignores a Heartbeat's checkpoint, so saying "saved" would be a lie."""


@dataclass
class HeldLease:
    """What the worker knows of one lease, as of the last reply that named it."""

    claimed: ClaimedJob
    expires_at: datetime
    cancel_requested: bool = False
    lost: bool = False
    # The handler has stopped and the outcome is being written: still renewed,
    # no longer worth a Claim's news (the write itself will say what became of it).
    finishing: bool = False


class LeaseBook:
    """The leases this process holds and the heartbeat loop that renews them.

    `send` makes the call (auth, stub) so that this class is only about
    batching; `clock` is the wall clock the server's expiry times are compared
    with."""

    def __init__(self, send: SendHeartbeat, clock: Clock, default_interval_seconds: float = 10.0) -> None:
        self._send = send
        self._clock = clock
        self._interval = default_interval_seconds
        self._held: dict[str, HeldLease] = {}
        self._any_held = asyncio.Event()
        self._beat_now = asyncio.Event()
        # Why the last beat did not renew anything, until one does.
        self._last_failure: str | None = None
        self._task: asyncio.Task[None] | None = None
        # Whether the server stores checkpoints (GetServerInfo's features),
        # as the worker found when it started.
        self.offers_checkpoints = True

    @property
    def interval_seconds(self) -> float:
        return self._interval

    def hold(self, claimed: ClaimedJob, interval_seconds: float) -> None:
        """Start renewing `claimed`'s lease, at the server's advised interval (the
        shortest seen, should claims disagree)."""
        if interval_seconds > 0 and (not self._held or interval_seconds < self._interval):
            self._interval = interval_seconds
        self._held[claimed.lease.job_id] = HeldLease(claimed, claimed.lease_expires_at)
        self._any_held.set()
        if (claimed.lease_expires_at - self._clock.now()).total_seconds() < self._interval:
            # Handed over with little lease left (the job waited in a slow
            # network, or this process was frozen): renewed now, since the next
            # regular beat could come after the lease has lapsed.
            self._beat_now.set()

    def finishing(self, lease: Lease) -> None:
        """The attempt's handler has stopped; its outcome is on its way."""
        held = self._held.get(lease.job_id)
        if held is not None and held.claimed.lease.token == lease.token:
            held.finishing = True

    def drop(self, lease: Lease) -> None:
        """The attempt ended: stop renewing it."""
        held = self._held.get(lease.job_id)
        if held is not None and held.claimed.lease.token == lease.token:
            del self._held[lease.job_id]
        if not self._held:
            self._any_held.clear()

    def held(self, lease: Lease) -> HeldLease:
        """The lease's latest state; LeaseLost when it is not held (any more) or
        the server said it is gone. Writes check this first, so nothing is sent
        for a lease already known to be lost, except an outcome on its way
        (`finishing`): once a finishing write lands the server reports that
        lease lost, so news of it arriving while the write is retried (its
        answer lost) says nothing of whether it landed; the retry's own answer
        does (protocol 2 answers a repeat as the first, a lost lease ABORTED)."""
        held = self._held.get(lease.job_id)
        if held is None or held.claimed.lease.token != lease.token or (held.lost and not held.finishing):
            raise LeaseLost(lease.job_id)
        return held

    def owner_of(self, lease: Lease) -> str:
        """The job's owner as the claim said (a Job message does not carry it)."""
        held = self._held.get(lease.job_id)
        return held.claimed.job.owner_id if held is not None else ""

    def renewed(self, lease: Lease) -> datetime:
        """The expiry the last reply gave. Raises LeaseLost when the server said
        lost or the expiry has passed with no renewal (the server will have
        recovered the job), and StorageUnavailable while beats are failing but
        the lease may still hold, which the executor logs and keeps waiting out."""
        held = self.held(lease)
        if self._clock.now() >= held.expires_at:
            held.lost = True
            raise LeaseLost(lease.job_id)
        if self._last_failure is not None:
            raise StorageUnavailable(f"heartbeat failed: {self._last_failure}")
        return held.expires_at

    def cancel_requested(self, lease: Lease) -> bool:
        return self.held(lease).cancel_requested

    async def save_checkpoint(self, lease: Lease, checkpoint: JsonObject, timeout: float) -> LeaseRenewal:
        """Save `checkpoint` with a renewal of this one lease, now. LeaseLost
        when the server says the lease is gone (nothing was saved); a failed
        call raises as any write does (`calls.mapped`), for the caller to retry
        while the lease holds."""
        held = self.held(lease)
        if not self.offers_checkpoints:
            raise CheckpointsUnsupported("the server does not store checkpoints (no 'checkpoints' feature)")
        request = worker_pb2.HeartbeatRequest(
            leases=[
                worker_pb2.LeaseRef(
                    job_id=lease.job_id, lease_token=lease.token, checkpoint=dict_to_struct(checkpoint)
                )
            ]
        )
        response = await mapped(self._send(request, timeout), lease.job_id)
        self._apply([held], response)
        if held.lost or not response.states:
            held.lost = True
            raise LeaseLost(lease.job_id)
        return LeaseRenewal(held.expires_at, held.cancel_requested)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="leasehold-worker-heartbeats")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _loop(self) -> None:
        while True:
            await self._any_held.wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._beat_now.wait()
            self._beat_now.clear()
            try:
                await self.beat_once()
            except Exception as exc:
                # A reply this process cannot read: keep beating, or every lease
                # would lapse; renewals stay in doubt until a beat succeeds.
                self._last_failure = type(exc).__name__
                log.error("worker.heartbeat_failed", error_class=type(exc).__name__, exc_info=exc)

    async def beat_once(self) -> None:
        """Renew every held lease in one call and record what the reply says."""
        # A lost lease is not sent again: its attempt is being stopped.
        sent = [held for held in self._held.values() if not held.lost][:MAX_LEASES_PER_HEARTBEAT]
        if not sent:
            return
        request = worker_pb2.HeartbeatRequest(
            leases=[
                worker_pb2.LeaseRef(job_id=held.claimed.lease.job_id, lease_token=held.claimed.lease.token)
                for held in sent
            ]
        )
        try:
            response = await self._send(request, max(2 * self._interval, MIN_BEAT_TIMEOUT_SECONDS))
        except grpc.aio.AioRpcError as exc:
            self._last_failure = exc.code().name
            level = log.warning if exc.code() is grpc.StatusCode.UNAVAILABLE else log.error
            level("worker.heartbeat_failed", leases=len(sent), code=exc.code().name)
            return
        self._last_failure = None
        self._apply(sent, response)

    def refs(self) -> list[worker_pb2.LeaseRef]:
        """The leases still worth hearing about (a Claim's `held_leases`): not
        those already known cancelled or lost, whose news would only end every
        Claim at once while their handlers wind down, nor those whose handler
        has stopped (their outcome's answer says what became of them)."""
        live = [
            held for held in self._held.values() if not (held.lost or held.cancel_requested or held.finishing)
        ]
        live = live[:MAX_LEASES_PER_HEARTBEAT]
        return [
            worker_pb2.LeaseRef(job_id=held.claimed.lease.job_id, lease_token=held.claimed.lease.token)
            for held in live
        ]

    def learn(self, news: Iterable[worker_pb2.LeaseState]) -> None:
        """What a Claim's reply said of held leases (only those with news): a
        cancel request, or a lease gone, known before the next heartbeat."""
        for state in news:
            held = self._held.get(state.job_id)
            if held is None:
                continue
            if state.lost:
                held.lost = True
            elif state.cancel_requested:
                held.cancel_requested = True

    def _apply(self, sent: list[HeldLease], response: worker_pb2.HeartbeatResponse) -> None:
        by_id = {state.job_id: state for state in response.states}
        for held in sent:
            state = by_id.get(held.claimed.lease.job_id)
            if state is None:
                continue  # not answered for: it keeps its last known expiry
            if state.lost:
                held.lost = True
                continue
            held.cancel_requested = state.cancel_requested
            if state.HasField("lease_expires_at"):
                held.expires_at = state.lease_expires_at.ToDatetime(tzinfo=UTC)

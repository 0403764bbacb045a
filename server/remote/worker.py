"""`Worker`: run a handler registry's jobs inside this process, for a server.

The roles follow the in-process runtime's: a claim loop (a long poll for as many
jobs as there are free slots), one `AttemptExecutor` run per job (the same one
`leasehold serve` uses, so handlers cannot tell the difference), and one
heartbeat loop for every lease the process holds (heartbeats.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

import grpc
import structlog

from leasehold._server.clock import Clock, SystemClock
from leasehold._server.defaults import DEFAULT_CONCURRENCY
from leasehold._server.jobs import limits
from leasehold._server.jobs.records import ClaimedJob
from leasehold._server.remote.calls import TRANSIENT_CODES, auth_metadata
from leasehold._server.remote.convert import claimed_from_proto
from leasehold._server.remote.heartbeats import MAX_LEASES_PER_HEARTBEAT, LeaseBook
from leasehold._server.remote.store import RemoteAttemptStore
from leasehold._server.runtime.asyncio_helpers import cancel_and_wait
from leasehold._server.runtime.claim_loop import default_worker_id
from leasehold._server.runtime.executor import AttemptExecutor
from leasehold._server.runtime.registry import HandlerRegistry
from leasehold.v1 import worker_pb2, worker_pb2_grpc

log = structlog.get_logger("leasehold.worker")

# Protocol 2 only adds to protocol 1, and this worker needs nothing a
# protocol-1 server lacks: with one, an AppendEvent's request_id is ignored and
# a retried finishing write that had landed is ABORTED (logged as a lost lease),
# as before; with a protocol-2 server both retries are answered.
PROTOCOL_VERSIONS = (1, 2)
# What a server offers when it stores a Heartbeat's checkpoint; an older one
# would drop it without a word, so the worker refuses `ctx.checkpoint` there.
CHECKPOINTS_FEATURE = "checkpoints"
MIN_TOKEN_LENGTH = 16
MAX_WORKER_ID_LENGTH = 128
MAX_JOBS_PER_CLAIM = 100
# How long one Claim long-polls; the server allows up to 60 s. Long enough that
# an idle worker costs the server little, short enough that a dead connection
# is noticed.
CLAIM_WAIT_SECONDS = 25.0
MIN_CLAIM_WAIT_SECONDS = 1.0
MAX_CLAIM_WAIT_SECONDS = 60.0
# A claim that has not answered this long after its wait is treated as lost.
CLAIM_DEADLINE_MARGIN_SECONDS = 10.0
# While claims come back full (the queue has more), the next claim waits until a
# quarter of the slots are free, or this long: one Claim then fills many slots
# instead of one per finished job, which costs a round trip and a write each.
REFILL_PAUSE_SECONDS = 0.01
SERVER_INFO_TIMEOUT_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 2.0
# Statuses that no retry fixes: the token, the kinds or the request are wrong.
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


# A claimed job may carry up to 4 MiB of its parents' results besides its
# payload and checkpoint (the server keeps a whole answer within 4 MiB, but
# sends a lone job however large): read more than gRPC's default 4 MiB.
_CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 16 * 1024 * 1024),)


class WorkerRefused(Exception):
    """The server cannot be worked for as configured (wrong token, a kind it
    does not route to remote workers, another protocol); the message says
    which, naming the setting to change."""


class Worker:
    """Runs the jobs of `registry`'s kinds that `server` routes to remote workers.

    The handler API is the in-process one: the same handler modules, the same
    `JobContext`, the same exceptions and results, the same timeouts.

        registry = HandlerRegistry()
        myapp.handlers.register(registry)
        worker = Worker("jobs.internal:50051", registry, token)
        await worker.run()          # until worker.stop(), from a signal handler say

    Args:
        server: "HOST:PORT" of a `leasehold serve` with `--remote-kinds`.
        registry: the handlers; a kind it serves that the server does not route
            to remote workers makes `run()` raise WorkerRefused.
        token: the worker's bearer token (at least 16 characters): the server's
            LEASEHOLD_WORKER_TOKEN under `--auth header`, a `worker` token or JWT
            under token or jwt auth; None when `credentials` carry a client
            certificate that identifies the worker (`--auth mtls`).
        concurrency: how many jobs run at once (1-1000).
        kinds: the kinds to claim; default every kind in the registry.
        worker_id: names this process in leases and logs; default host:pid:random.
        stop_grace_seconds: how long `stop()` lets running handlers finish before
            cancelling them; a cancelled attempt is handed back (snoozed), not
            counted, so nothing waits out its lease.
        credentials: TLS channel credentials (cli/worker.py's tls_credentials builds
            them from files); default a plaintext channel.
        claim_wait_seconds: how long one Claim long-polls (1-60).
        clock: compares the server's lease expiries with now; tests inject one.
    """

    def __init__(
        self,
        server: str,
        registry: HandlerRegistry,
        token: str | None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        kinds: Iterable[str] | None = None,
        worker_id: str | None = None,
        stop_grace_seconds: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
        claim_wait_seconds: float = CLAIM_WAIT_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        self.server = server
        self.kinds = _kinds(registry, kinds)
        self.worker_id = worker_id or default_worker_id()
        _check(server, token, concurrency, self.worker_id, stop_grace_seconds, claim_wait_seconds)
        self._registry = registry
        self._token = token
        self._concurrency = concurrency
        self._stop_grace = stop_grace_seconds
        self._credentials = credentials
        self._claim_wait = claim_wait_seconds
        self._clock = clock or SystemClock()
        self._running: set[asyncio.Task[None]] = set()
        # Attempts whose handler has not stopped: what the slots count. A slot
        # is free as soon as its handler stops, before its outcome is written,
        # so the claim for it travels while the outcome does (as in process)
        # instead of after the outcome's answer.
        self._busy_slots = 0
        self._slot_freed = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._started = False
        self._executors: dict[float, AttemptExecutor] = {}

    @property
    def active_jobs(self) -> int:
        return len(self._running)

    async def run(self) -> None:
        """Connect, check the server, then claim and run jobs until `stop()`.
        Returns once every claimed job has ended or been handed back. Raises
        WorkerRefused when the server refuses this worker's configuration."""
        if self._started:
            raise RuntimeError("Worker.run() can be called once")
        self._started = True
        metadata = auth_metadata(self._token)
        async with self._channel() as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            leases = LeaseBook(
                lambda request, timeout: stub.Heartbeat(request, metadata=metadata, timeout=timeout),
                self._clock,
            )
            store = RemoteAttemptStore(stub, leases, self._token, self._clock)
            try:
                if not await self._server_checked(stub, leases):
                    return
                leases.start()
                log.info(
                    "worker.started", worker_id=self.worker_id, kinds=sorted(self.kinds), server=self.server
                )
                claimer = asyncio.create_task(
                    self._claim_loop(stub, leases, store), name="leasehold-worker-claimer"
                )
                refused = await self._until_stopped(claimer)
                await leases.stop()
                if refused is not None:
                    raise refused  # a refusal the claim loop met, now that nothing runs
            finally:
                self._stopped.set()
                log.info("worker.stopped", worker_id=self.worker_id)

    async def stop(self) -> None:
        """Stop claiming (the long poll in flight is abandoned, which takes no
        job), let running handlers finish for `stop_grace_seconds`, cancel the
        rest (handed back), and return once `run()` has. Safe to call twice,
        and before or without `run()`."""
        self._stop_requested.set()
        if self._started:
            await self._stopped.wait()

    async def _until_stopped(self, claimer: asyncio.Task[None]) -> BaseException | None:
        """Wait for stop() or for the claim loop to give up, then drain; returns
        why the claim loop gave up, if it did."""
        stop_waiter = asyncio.create_task(self._stop_requested.wait(), name="leasehold-worker-stop")
        try:
            await asyncio.wait({claimer, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_waiter.cancel()
            refused = claimer.exception() if claimer.done() and not claimer.cancelled() else None
            await self._drain(claimer)
        return refused

    def _channel(self) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.server, options=_CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(self.server, self._credentials, options=_CHANNEL_OPTIONS)

    async def _server_checked(self, stub: worker_pb2_grpc.WorkerServiceStub, leases: LeaseBook) -> bool:
        """Ask GetServerInfo, waiting out a server that is not up yet; False when
        stopped first. Raises WorkerRefused for a refused token or another protocol."""
        backoff = _Backoff()
        while not self._stop_requested.is_set():
            try:
                info: worker_pb2.GetServerInfoResponse = await stub.GetServerInfo(
                    worker_pb2.GetServerInfoRequest(protocol_version=max(PROTOCOL_VERSIONS)),
                    metadata=auth_metadata(self._token),
                    timeout=SERVER_INFO_TIMEOUT_SECONDS,
                )
            except grpc.aio.AioRpcError as exc:
                _raise_if_fatal(exc)
                log.warning("worker.server_unavailable", server=self.server, code=exc.code().name)
                # Sleep the backoff, but wake at once for stop().
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff.next_delay()):
                        await self._stop_requested.wait()
                continue
            if info.protocol_version not in PROTOCOL_VERSIONS:
                spoken = " or ".join(str(version) for version in PROTOCOL_VERSIONS)
                raise WorkerRefused(
                    f"server: {self.server} speaks WorkerService protocol {info.protocol_version}; "
                    f"this worker speaks {spoken}"
                )
            leases.offers_checkpoints = CHECKPOINTS_FEATURE in info.features
            return True
        return False

    async def _claim_loop(
        self, stub: worker_pb2_grpc.WorkerServiceStub, leases: LeaseBook, store: RemoteAttemptStore
    ) -> None:
        backoff = _Backoff()
        metadata = auth_metadata(self._token)
        refill = max(1, self._concurrency // 4)
        queue_had_more = False
        while True:
            while self._busy_slots >= self._concurrency:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            if queue_had_more:
                await self._slots_free(refill, REFILL_PAUSE_SECONDS)
            free = min(self._concurrency - self._busy_slots, MAX_JOBS_PER_CLAIM)
            request = worker_pb2.ClaimRequest(
                worker_id=self.worker_id,
                kinds=sorted(self.kinds),
                max_jobs=free,
                wait_seconds=self._claim_wait,
                # So that a cancel of a running job ends this wait at once.
                held_leases=leases.refs(),
            )
            try:
                response: worker_pb2.ClaimResponse = await stub.Claim(
                    request, metadata=metadata, timeout=self._claim_wait + CLAIM_DEADLINE_MARGIN_SECONDS
                )
            except grpc.aio.AioRpcError as exc:
                _raise_if_fatal(exc)
                level = log.warning if exc.code() in TRANSIENT_CODES else log.error
                level("worker.claim_failed", code=exc.code().name)
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff.reset()
            leases.learn(response.held)
            queue_had_more = len(response.jobs) == free
            for message in response.jobs:
                self._start_claimed(message, leases, store)

    async def _slots_free(self, wanted: int, most_seconds: float) -> None:
        """Until `wanted` slots are free, or `most_seconds` have passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(most_seconds):
                while self._concurrency - self._busy_slots < wanted:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()

    def _start_claimed(
        self, message: worker_pb2.ClaimedJob, leases: LeaseBook, store: RemoteAttemptStore
    ) -> None:
        try:
            claimed = claimed_from_proto(message)
        except ValueError as exc:
            # A payload this process cannot read (NaN, say): not run, its lease
            # expires and the server recovers the job for another attempt.
            log.error("worker.claim_unreadable", job_id=message.job.id, error_class=type(exc).__name__)
            return
        self._start(claimed, message.heartbeat_interval_seconds, leases, store)

    def _start(
        self, claimed: ClaimedJob, interval_seconds: float, leases: LeaseBook, store: RemoteAttemptStore
    ) -> None:
        leases.hold(claimed, interval_seconds)
        executor = self._executor(store, interval_seconds or leases.interval_seconds)
        self._busy_slots += 1
        freed = False

        def free_slot(_ended: object = None) -> None:
            nonlocal freed
            if not freed:
                freed = True
                self._busy_slots -= 1
                leases.finishing(claimed.lease)
                self._slot_freed.set()

        task = asyncio.create_task(
            self._attempt(executor, claimed, leases, free_slot), name=f"leasehold-attempt-{claimed.job.id}"
        )
        self._running.add(task)
        task.add_done_callback(free_slot)  # a handler that never began (cancelled at once)
        task.add_done_callback(self._attempt_done)

    def _executor(self, store: RemoteAttemptStore, interval_seconds: float) -> AttemptExecutor:
        """The server advises heartbeats at a third of its lease (as the
        in-process runtime renews), so the lease is three intervals: the
        executor renews (from the batched state) once per interval and rides
        out a failing write for at most that long."""
        executor = self._executors.get(interval_seconds)
        if executor is None:
            executor = AttemptExecutor(store, self._registry, 3 * interval_seconds, clock=self._clock)
            self._executors[interval_seconds] = executor
        return executor

    @staticmethod
    async def _attempt(
        executor: AttemptExecutor, claimed: ClaimedJob, leases: LeaseBook, free_slot: Callable[[], None]
    ) -> None:
        try:
            await executor.execute(claimed, free_slot)
        finally:
            leases.drop(claimed.lease)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            # The executor handles every outcome it knows; this is a status it
            # could not (say UNAUTHENTICATED mid-run): the lease expires and
            # the server recovers the job.
            log.error("worker.attempt_crashed", error_class=type(task.exception()).__name__)

    async def _drain(self, claimer: asyncio.Task[None]) -> None:
        log.info("worker.stopping", worker_id=self.worker_id, running=len(self._running))
        if not claimer.done():
            await cancel_and_wait(claimer)
        if self._running and self._stop_grace > 0:
            await asyncio.wait(self._running, timeout=self._stop_grace)
        for task in list(self._running):
            task.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


class _Backoff:
    """Exponential, capped: a restarting server is retried quickly at first,
    then every couple of seconds, never hammered."""

    def __init__(self) -> None:
        self._delay = FIRST_BACKOFF_SECONDS

    def reset(self) -> None:
        self._delay = FIRST_BACKOFF_SECONDS

    def next_delay(self) -> float:
        delay, self._delay = self._delay, min(self._delay * 2, MAX_BACKOFF_SECONDS)
        return delay


def _raise_if_fatal(error: grpc.aio.AioRpcError) -> None:
    code = error.code()
    if code not in FATAL_CODES:
        return
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        # The server's words name what it refused (a bad token, a kind this credential may not claim).
        raise WorkerRefused(
            "LEASEHOLD_WORKER_TOKEN: the server refused this worker's credential "
            f"({code.name}: {error.details()})"
        )
    if code is grpc.StatusCode.UNIMPLEMENTED:
        raise WorkerRefused("server: it does not serve leasehold.v1.WorkerService")
    raise WorkerRefused(f"kinds: the server refused the claim: {error.details()}")


def _kinds(registry: HandlerRegistry, kinds: Iterable[str] | None) -> frozenset[str]:
    chosen = registry.kinds() if kinds is None else frozenset(kinds)
    if not chosen:
        raise ValueError("kinds: the handler registry serves no kind")
    unserved = sorted(chosen - registry.kinds())
    if unserved:
        raise ValueError(f"kinds: no handler is registered for {', '.join(map(repr, unserved))}")
    return chosen


def _check(
    server: str, token: str | None, concurrency: int, worker_id: str, stop_grace: float, claim_wait: float
) -> None:
    """Every argument checked up front, naming the setting, so a bad one fails
    at construction rather than as a server's INVALID_ARGUMENT later."""
    if not server:
        raise ValueError("server: must be HOST:PORT")
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"LEASEHOLD_WORKER_TOKEN: must be at least {MIN_TOKEN_LENGTH} characters")
    if not 1 <= concurrency <= MAX_LEASES_PER_HEARTBEAT:
        raise ValueError(f"concurrency: must be between 1 and {MAX_LEASES_PER_HEARTBEAT}")
    if not 1 <= len(worker_id) <= MAX_WORKER_ID_LENGTH or limits.NUL in worker_id:
        raise ValueError(f"worker_id: must be 1-{MAX_WORKER_ID_LENGTH} characters")
    if not stop_grace >= 0:  # also refuses NaN
        raise ValueError("stop_grace_seconds: must be at least 0")
    # At least a second: a worker that only looked once per call would ask again
    # at once whenever the queue is empty, a busy loop against the server.
    if not MIN_CLAIM_WAIT_SECONDS <= claim_wait <= MAX_CLAIM_WAIT_SECONDS:
        raise ValueError(
            f"claim_wait_seconds: must be between {MIN_CLAIM_WAIT_SECONDS:g} and {MAX_CLAIM_WAIT_SECONDS:g}"
        )

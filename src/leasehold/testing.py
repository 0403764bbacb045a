"""Run a handler without a server, for its unit tests.

    from leasehold.testing import JobEnvironment
    from leasehold.worker import JobContext

    async def greet(ctx: JobContext) -> None:
        await ctx.append_event("greeted", {"name": ctx.payload["name"]})

    async def test_greet() -> None:
        run = await JobEnvironment().run(greet, {"name": "Ada"})
        assert run.status == "succeeded"
        assert run.handler_events == [("greeted", {"name": "Ada"})]

`JobEnvironment.run` enqueues one job, and claims and executes its attempts with
the service's own in-process runtime code over an in-memory job store that
passes the same contract suite as the databases. So every rule the service
applies is applied here, by the same code: the payload is validated and
converted as Enqueue does, a raise is a failed attempt retried with backoff
until `max_attempts`, `PermanentError` fails at once, `ctx.raise_if_cancelled()`
stops at a requested cancel, a handler that returns after a cancel request still
ends cancelled, and the event log (`JobRun.events`) is the log WatchEvents would
show, lifecycle events included.

Checkpoints work as in the service: `await ctx.checkpoint(state)` stores it for
the next attempt's `ctx.last_checkpoint`, and `JobRun.checkpoint` is the last one
saved. To test resuming without first running the attempt that stopped, pass
`checkpoint=` to `run`: the first attempt begins with it, as if an earlier
attempt had saved it.

A step of a graph of jobs reads what its parents returned in
`ctx.parent_results`; pass `parent_results=` (parent job id -> result) to
`run` and every attempt sees them, as if the job depended on jobs that had
succeeded with these results:

    async def merge(ctx: JobContext) -> dict[str, Any]:
        return {"total": sum(r["count"] for r in ctx.parent_results.values())}

    run = await JobEnvironment().run(merge, parent_results={"job_a": {"count": 2}, "job_b": {"count": 3}})
    assert run.result == {"total": 5}

    async def copy_pages(ctx: JobContext) -> None:
        start = (ctx.last_checkpoint or {}).get("page", 0)
        for page in range(start, ctx.payload["pages"]):
            await ctx.append_event("copied", {"page": page})
            await ctx.checkpoint({"page": page + 1})

    run = await JobEnvironment().run(copy_pages, {"pages": 3}, checkpoint={"page": 2})
    assert run.handler_events == [("copied", {"page": 2})]

Time is a `ManualClock`: the environment moves it through each retry's backoff
instead of sleeping, so a test of three attempts takes no longer than the
handler's own code. Only `timeout_seconds` is real time, as in the service
(an attempt's deadline runs on the event loop's clock).

For an integration test against the real thing (a worker process of yours, in
any language, or a client), `ServerProcess` runs `leasehold serve` as a child
process on a port the kernel picks, so tests running side by side never race
for a free port, and reads the address back from the server's `server.started`
log line:

    from leasehold.testing import ServerProcess, serve_args

    url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    with ServerProcess(serve_args(url, "--handlers", "myjobs")) as server:
        address = server.wait_started().address  # "127.0.0.1:PORT"
        ...  # point your worker or client at it
    # leaving the block: SIGTERM (serve drains), a bounded wait, then SIGKILL
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from google.protobuf import struct_pb2

from leasehold._server.api import validation
from leasehold._server.clock import ManualClock
from leasehold._server.jobs import dependencies, limits
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import (
    ClaimResult,
    Job,
    JobEvent,
    JsonObject,
    Lease,
    LeaseRenewal,
    NewJob,
)
from leasehold._server.jobs.routing import ANY_KIND, KindFilter, ServedKinds
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold._server.runtime.executor import AttemptExecutor
from leasehold._server.runtime.registry import Handler, HandlerRegistry
from leasehold.v1 import jobs_pb2

__all__ = [
    "Event",
    "JobEnvironment",
    "JobRun",
    "ManualClock",
    "ServerNotStarted",
    "ServerProcess",
    "ServerStarted",
    "serve_args",
    "started_record",
    "stop_servers",
]

OWNER_ID = "leasehold-testing"
WORKER_ID = "leasehold-testing-worker"
# Far more than one job's log can hold in a test.
_ALL_EVENTS = 1_000_000


class Event(NamedTuple):
    """One entry of a job's event log; compares equal to a `(type, payload)` tuple."""

    type: str
    payload: JsonObject


@dataclass(frozen=True)
class JobRun:
    """How a job ended, and its whole event log."""

    job_id: str
    status: str  # "succeeded" | "failed" | "cancelled"
    attempts: int  # attempts counted against max_attempts
    error_message: str | None  # the last failed attempt's error, unless the job succeeded
    error_type: str | None  # the exception class the service recorded with it
    events: list[Event]  # every event, lifecycle ones (types starting "job.") included, in order
    result: JsonObject | None = None  # what the handler returned, if the job succeeded
    checkpoint: JsonObject | None = None  # the last checkpoint saved (`ctx.checkpoint`), if any

    @property
    def handler_events(self) -> list[Event]:
        """Only the events the handler appended itself."""
        return [event for event in self.events if not event.type.startswith(limits.RESERVED_EVENT_PREFIX)]


class JobEnvironment:
    """Runs jobs one at a time on its own manual clock (`clock`).

    `lease_seconds` is the service's `--lease-seconds` (30 unless given): a
    handler that moves `clock` past it loses its lease, exactly as a stalled
    worker would, and the job's next attempt recovers it.
    """

    def __init__(self, clock: ManualClock | None = None, *, lease_seconds: float = 30.0) -> None:
        self.clock = clock or ManualClock()
        self._lease_seconds = RuntimeSettings(lease_seconds=lease_seconds).lease_seconds
        self._running: tuple[MemoryJobRepository, str] | None = None

    async def run(
        self,
        handler: Handler | HandlerRegistry,
        payload: JsonObject | None = None,
        *,
        kind: str = "test.kind",
        max_attempts: int = 3,
        timeout_seconds: int = 900,
        cancel_after_events: int | None = None,
        checkpoint: JsonObject | None = None,
        parent_results: Mapping[str, JsonObject] | None = None,
    ) -> JobRun:
        """Enqueue a job of `kind` and run its attempts to the end.

        `handler` is the handler itself, or a `HandlerRegistry` (say, the one
        your module's `register()` filled) that serves `kind`. A cancel is
        requested once the handler has appended `cancel_after_events` events
        of its own, or whenever `cancel()` is awaited while the job runs.
        With `checkpoint`, the first attempt's `ctx.last_checkpoint` is it, as
        if an earlier attempt had saved it (checked as `ctx.checkpoint` checks).
        With `parent_results`, every attempt's `ctx.parent_results` is it (each
        checked as a handler's result is; as in the service, those past the
        4 MiB they may take together are left out).
        Raises ValueError for what Enqueue would refuse (INVALID_ARGUMENT).
        """
        if self._running is not None:
            raise RuntimeError("a JobEnvironment runs one job at a time; use one environment per job")
        registry = handler if isinstance(handler, HandlerRegistry) else _serving(kind, handler)
        new_job = _validated(kind, payload or {}, max_attempts, timeout_seconds, registry, self.clock)
        repository = _CancellingRepository(self.clock, cancel_after_events)
        if checkpoint is not None:
            _checked_checkpoint(checkpoint)
        if parent_results:
            repository.parent_results = _checked_parent_results(parent_results)
        job, _ = await repository.enqueue(new_job)
        repository.job_id = job.id
        repository.saved_checkpoint = checkpoint
        self._running = (repository, job.id)
        try:
            job = await self._run_attempts(repository, registry, job)
            events = await repository.list_events(OWNER_ID, job.id, 0, _ALL_EVENTS)
            saved = repository.saved_checkpoint
        finally:
            self._running = None
            await repository.close()
        return JobRun(
            job_id=job.id,
            status=job.status.value,
            attempts=job.attempt,
            error_message=job.error_message,
            error_type=job.error_type,
            events=[Event(event.type, event.payload) for event in events],
            result=job.result,
            checkpoint=saved,
        )

    async def cancel(self) -> None:
        """Request a cancel of the job being run, as the owner's Cancel does: a
        running handler sees it at its next `ctx.raise_if_cancelled()` (and
        ends cancelled even if it returns), a job waiting for its retry is
        cancelled at once. Call it from the handler or from another task."""
        if self._running is None:
            raise RuntimeError("cancel() needs a job running in this environment")
        repository, job_id = self._running
        await repository.cancel(OWNER_ID, job_id)

    async def _run_attempts(
        self, repository: MemoryJobRepository, registry: HandlerRegistry, job: Job
    ) -> Job:
        """What the service's claim loop does for one job, with the clock moved
        to the next moment something can happen instead of waiting for it."""
        executor = AttemptExecutor(repository, registry, self._lease_seconds, clock=self.clock)
        while not job.status.is_terminal:
            result = await repository.claim(WORKER_ID, 1, self._lease_seconds)
            for claimed in result.jobs:
                await executor.execute(claimed)
            if not result.jobs:
                if result.next_wakeup_at is None:  # cannot happen to a job that is not finished
                    raise AssertionError(f"job {job.id} is {job.status.value} with nothing due")
                self.clock.advance(max(0.0, (result.next_wakeup_at - self.clock.now()).total_seconds()))
            job = await repository.get(OWNER_ID, job.id)
        return job


class _CancellingRepository(MemoryJobRepository):
    """The in-memory store, plus the owner's cancel request once the handler
    has appended `after_events` events (when given)."""

    def __init__(self, clock: ManualClock, after_events: int | None) -> None:
        super().__init__(clock)
        self.job_id = ""
        self._after_events = after_events
        self._appended = 0
        # The last checkpoint saved: `run(checkpoint=...)`'s until an attempt
        # saves one. Only the seed is served from here (the store holds what
        # attempts save), so an attempt that saves nothing passes it on.
        self.saved_checkpoint: JsonObject | None = None
        # `run(parent_results=...)`'s, handed to every attempt.
        self.parent_results: dict[str, JsonObject] = {}

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        result = await super().claim(worker_id, limit, lease_seconds, kinds)
        if self.parent_results:
            parents = self.parent_results
            result = replace(
                result, jobs=[replace(claimed, parent_results=_as_stored(parents)) for claimed in result.jobs]
            )
        seed = self.saved_checkpoint
        if seed is None or all(claimed.checkpoint is not None for claimed in result.jobs):
            return result
        seeded = [
            claimed if claimed.checkpoint is not None else replace(claimed, checkpoint=_as_stored(seed))
            for claimed in result.jobs
        ]
        return replace(result, jobs=seeded)

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        renewal = await super().save_checkpoint(lease, checkpoint, lease_seconds)
        self.saved_checkpoint = _as_stored(checkpoint)
        return renewal

    async def append_event(
        self, lease: Lease, event_type: str, payload: JsonObject, request_id: str | None = None
    ) -> JobEvent:
        event = await super().append_event(lease, event_type, payload, request_id)
        self._appended += 1
        if self._appended == self._after_events:
            await self.cancel(OWNER_ID, self.job_id)
        return event


def _as_stored(value: JsonObject) -> JsonObject:
    """A copy of `value`, as the next attempt would read it back."""
    copied: JsonObject = json.loads(json.dumps(value))
    return copied


def _checked_checkpoint(checkpoint: JsonObject) -> None:
    try:
        limits.check_payload(checkpoint, field="checkpoint")
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


def _checked_parent_results(results: Mapping[str, JsonObject]) -> dict[str, JsonObject]:
    """`results` as a handler would be handed them: each must be a result the
    service would have stored, and, as a claim does, they are taken in order
    while they fit in `dependencies.PARENT_RESULTS_LIMIT_BYTES` (serialized as
    JSON); one that does not fit in what is left is left out, so a test can
    see what a handler of a wide fan-in meets."""
    for parent_id, result in results.items():
        try:
            limits.check_payload(result, field=f"parent_results[{parent_id!r}]")
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
    kept = dependencies.handed_results(results, results)
    return _as_stored(kept)


def _serving(kind: str, handler: Handler) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(kind, handler)  # refuses an invalid kind with ValueError
    return registry


def _validated(
    kind: str,
    payload: JsonObject,
    max_attempts: int,
    timeout_seconds: int,
    registry: HandlerRegistry,
    clock: ManualClock,
) -> NewJob:
    """The job as the service's Enqueue would take it: the same checks, and the
    payload converted the way it reaches a handler after travelling as a
    `google.protobuf.Struct`."""
    try:
        limits.check_payload(payload)  # names what is wrong before protobuf would choke on it
        struct = struct_pb2.Struct()
        struct.update(payload)
        request = jobs_pb2.EnqueueRequest(
            kind=kind, payload=struct, max_attempts=max_attempts, timeout_seconds=timeout_seconds
        )
        return validation.new_job(OWNER_ID, request, ServedKinds(registry), clock.now())
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


# ----- a real server, as a child process -------------------------------------------------

SERVER_STARTED = "server.started"
# How often a server whose output goes to a file is looked at while it starts.
_POLL_SECONDS = 0.02
# Lines of output kept for the error of a server that did not start.
_TAIL_LINES = 50
# How long a SIGKILLed process, or one that closed its output, gets to be reaped.
_REAP_SECONDS = 10.0


def started_record(line: str | bytes) -> dict[str, Any] | None:
    """The record if `line` is a `server.started` JSON log line, else None.

    That line is the only place `serve` tells the port it bound for `--listen HOST:0`,
    and it comes once the server answers, so it is both the address and the signal
    that the server is ready."""
    # Most lines are not it: no JSON parse for them.
    if (SERVER_STARTED.encode() not in line) if isinstance(line, bytes) else (SERVER_STARTED not in line):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("event") == SERVER_STARTED else None


def serve_args(
    database_url: str,
    *flags: str,
    listen: str = "127.0.0.1:0",
    command: Sequence[str] = (sys.executable, "-m", "leasehold"),
) -> list[str]:
    """`leasehold serve` on `database_url` (migrated on start), listening on a port the kernel
    picks unless `listen` names one: the command line for `ServerProcess`."""
    return [*command, "serve", "--database-url", database_url, "--listen", listen, *flags]


@dataclass(frozen=True)
class ServerStarted:
    """Where a started server can be reached, from its `server.started` record
    (`record`, whole: it also names the auth mode, the worker id, the kinds...)."""

    record: dict[str, Any]

    @property
    def port(self) -> int:
        return int(self.record["port"])

    @property
    def address(self) -> str:
        """`host:port` to connect to: the `--listen` host (loopback for a wildcard) and the bound port."""
        host = str(self.record.get("listen", "")).rpartition(":")[0]
        return f"{'127.0.0.1' if host in ('', '0.0.0.0', '[::]') else host}:{self.port}"

    @property
    def dashboard(self) -> str | None:
        """The dashboard's URL (`--dashboard-listen`), or None when it is off."""
        return self._url("dashboard")

    @property
    def metrics(self) -> str | None:
        """The Prometheus endpoint's URL (`--metrics-listen`), or None when it is off."""
        return self._url("metrics")

    def _url(self, key: str) -> str | None:
        value = self.record.get(key, "off")
        return None if value == "off" else str(value)


class ServerNotStarted(RuntimeError):
    """The server exited (`returncode`) or, still silent at the deadline, was killed
    (`returncode` None) before it logged `server.started`; `output` is its last lines."""

    def __init__(self, pid: int, returncode: int | None, output: str, timeout: float) -> None:
        # Not the command line: a database URL in it may hold a password.
        if returncode is None:
            message = f"server (pid {pid}) did not start within {timeout:g}s"
        else:
            message = f"server (pid {pid}) exited with status {returncode} before it started"
        super().__init__(f"{message}; its output ends:\n{output}")
        self.returncode = returncode
        self.output = output


class ServerProcess:
    """A server as a child process: `leasehold serve`, or anything that logs the same
    `server.started` JSON line. Starts at once; `wait_started` then waits for that line.

    Its output (stderr, stdout folded in) goes where the caller can afford it. With
    `log`, the child appends to that file and nobody reads it while it runs: the server
    never blocks on a pipe and no reader takes CPU beside it, which is what a benchmark
    needs. Without, a thread reads it and hands each line to `on_line` (say, to keep the
    records a test asserts on) before looking for the started line, so whatever
    `on_line` keeps already holds that line once `wait_started` returns.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log: Path | None = None,
        on_line: Callable[[str], None] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        if log is not None and on_line is not None:
            raise ValueError("on_line reads piped output: give `log` or `on_line`, not both")
        self.args = list(args)
        self.log = log
        self.started: ServerStarted | None = None
        self._on_line = on_line
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._eof = threading.Event()  # the piped output has ended
        self._reader: threading.Thread | None = None
        # A log that already holds an earlier server's lines must not start this one.
        self._offset = log.stat().st_size if log is not None and log.exists() else 0
        common: dict[str, Any] = {
            "cwd": cwd,
            "env": None if env is None else dict(env),
            "stdin": subprocess.DEVNULL,
            "stderr": subprocess.STDOUT,
            "preexec_fn": preexec_fn,
            "text": True,
            "encoding": "utf-8",
            "errors": "replace",
        }
        if log is not None:
            with open(log, "ab") as sink:
                self.process: subprocess.Popen[str] = subprocess.Popen(self.args, stdout=sink, **common)
        else:
            self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, **common)
            self._reader = threading.Thread(target=self._read, name=f"output of {self.pid}", daemon=True)
            self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def wait_started(self, timeout: float = 60.0) -> ServerStarted:
        """Until the server has logged `server.started`. A server that exits first, or
        is still silent after `timeout`, is killed and raises ServerNotStarted."""
        deadline = time.monotonic() + timeout
        while self.started is None and not self._eof.is_set():
            exited = self.process.poll() is not None
            if self._reader is None:
                self._scan_log()
                if exited:  # the scan above saw everything it wrote
                    break
            if self.started is not None or time.monotonic() >= deadline:
                break
            self._eof.wait(_POLL_SECONDS)
        if self.started is not None:
            return self.started
        code = self.process.poll()
        if code is None and self._eof.is_set():  # it closed its output: it is on its way out
            try:
                code = self.process.wait(_REAP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        raise ServerNotStarted(self.pid, code, self.output_tail(), timeout)

    def stop(self, timeout: float = 15.0, signum: int = signal.SIGTERM) -> int | None:
        """`signum` (SIGTERM: serve drains its running jobs, as under a service manager),
        `timeout` seconds for the exit, then SIGKILL. The exit status; None if it was killed."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self._exit_or_kill(timeout)

    def wait(self, timeout: float) -> int:
        """Until the process has exited (after a signal the caller sent) and its output is
        all read; raises subprocess.TimeoutExpired after `timeout`."""
        code = self.process.wait(timeout)
        self._join_reader()
        return code

    def kill(self) -> None:
        """SIGKILL, if it still runs: no clean-up at all, like a crash or the OOM killer."""
        if self.process.poll() is None:
            self.process.kill()
            try:
                self.process.wait(_REAP_SECONDS)
            except subprocess.TimeoutExpired:  # stuck in the kernel: nothing more to do from here
                pass
        self._join_reader()

    def output_tail(self, lines: int = 15) -> str:
        """The last `lines` lines of its output, for an error message."""
        if self.log is None:
            return "".join(list(self._tail)[-lines:])
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _exit_or_kill(self, timeout: float) -> int | None:
        try:
            code: int | None = self.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        return code

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                self._tail.append(line)
                if self._on_line is not None:
                    self._on_line(line)
                if self.started is None and (record := started_record(line)) is not None:
                    self.started = ServerStarted(record)
        finally:
            self._eof.set()

    def _scan_log(self) -> None:
        """Look through what the log gained since the last scan, complete lines only."""
        assert self.log is not None
        with open(self.log, "rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        complete = chunk.rfind(b"\n") + 1
        self._offset += complete
        for raw in chunk[:complete].splitlines():
            if (record := started_record(raw)) is not None:
                self.started = ServerStarted(record)
                return

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(_REAP_SECONDS)


def stop_servers(
    servers: Iterable[ServerProcess], timeout: float = 15.0, signum: int = signal.SIGTERM
) -> list[int | None]:
    """Stop every server as `ServerProcess.stop` does, the signal sent to all of them
    first, so their drains overlap instead of adding up. Their exit statuses, in order."""
    servers = list(servers)
    for server in servers:
        if server.returncode is None:
            server.process.send_signal(signum)
    return [server._exit_or_kill(timeout) for server in servers]

"""Child processes of the bench: servers (Leasehold's `serve`, the no-op gRPC baseline, the huey
consumer) and one-shot Python children (load generators, seeders, in-process runtimes).

Why their stderr goes to a file rather than a pipe: the machine has two cores, and a bench
process that reads and parses the server's log lines (a few per job) would take CPU from the
very server it measures. A file never blocks the writer and needs no reader; the bench looks at it
only to learn the port at start-up and to show a tail when something breaks. Production logs end
up in a file or journal too, so the server pays the same cost it pays there.

Every process started here is registered, and `kill_all()` (called by the suite on every exit
path) kills whatever is still alive, by its own pid only. In case the bench itself is killed
outright (SIGKILL, where no cleanup code runs), each child also asks the kernel to SIGKILL it
when the bench dies (prctl PR_SET_PDEATHSIG, Linux only).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, BenchError, FigureSkipped, sqlite_url, tail, wait_until
from leasehold import testing

_LIVE: dict[int, subprocess.Popen[Any]] = {}
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL me when my parent dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: kill_all() still covers every normal exit
        pass


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    """The bench's environment without its own settings (LEASEHOLD_*, BENCH_*), plus `env`."""
    base = {key: value for key, value in os.environ.items() if not key.startswith(("LEASEHOLD_", "BENCH_"))}
    base["PYTHONUNBUFFERED"] = "1"
    base.update(env or {})
    return base


def _spawn(args: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            env=_child_env(env),
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=_die_with_parent,  # safe: the bench process starts no threads
        )
    _LIVE[process.pid] = process
    return process


def unique_stem(directory: Path, stem: str) -> str:
    """`stem`, or `stem-2`, `stem-3`... whichever has no file yet: two servers or children of the
    same name in one directory must never share a log or a result file."""
    candidate, n = stem, 1
    while any(directory.glob(f"{candidate}.*")):
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def _reap(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.kill()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    _LIVE.pop(process.pid, None)


def kill_all() -> None:
    """Kill every child this bench started that is still running."""
    for process in list(_LIVE.values()):
        _reap(process)


# ----- servers ------------------------------------------------------------------------------------


class ServerProcess(testing.ServerProcess):
    """A server (Leasehold's `serve`, or the no-op baseline, which logs the same `server.started`
    line on purpose) through the harness the tests use too, its output in `log_path`, registered
    for kill_all() like every child here."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(args, env=_child_env(env), cwd=REPO_ROOT, log=log_path, preexec_fn=_die_with_parent)
        self.name = name
        self.log_path = log_path
        _LIVE[self.pid] = self.process

    @property
    def target(self) -> str:
        """Where to connect ("127.0.0.1:PORT"), once started."""
        return self._started().address

    @property
    def record(self) -> dict[str, Any]:
        """Its `server.started` record, once started."""
        return self._started().record

    def _started(self) -> testing.ServerStarted:
        if self.started is None:
            raise BenchError(f"{self.name}: not started")
        return self.started

    def alive(self) -> bool:
        """True while the server runs; raises BenchError with its log's tail once it has exited
        (for use inside wait_until conditions, so a crashed server fails fast and says why)."""
        code = self.process.poll()
        if code is not None:
            raise BenchError(f"{self.name} exited with status {code}:\n{tail(self.log_path)}")
        return True

    def status_kb(self, key: str) -> int:
        """A `Vm*` line of /proc/PID/status, in kB (VmHWM is the peak resident set size)."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise BenchError(f"no {key} in /proc/{self.pid}/status")

    def kill(self) -> None:
        super().kill()
        _LIVE.pop(self.pid, None)

    def __enter__(self) -> ServerProcess:
        return self


class ServerExited(BenchError):
    def __init__(self, name: str, code: int, log_tail: str) -> None:
        super().__init__(f"{name} exited with status {code} before it started:\n{log_tail}")
        self.code = code
        self.log_tail = log_tail


def _await_start(server: ServerProcess, timeout: float) -> None:
    """Wait for the server's `server.started` record, in the bench's errors."""
    try:
        server.wait_started(timeout)
    except testing.ServerNotStarted as exc:
        if exc.returncode is None:
            raise BenchError(f"{server.name}: {exc}") from None
        raise ServerExited(server.name, exc.returncode, exc.output) from None


BENCH_SHUTDOWN_GRACE = "0.5"


def leasehold_server(
    directory: Path,
    database: Path | str,
    concurrency: int | None,
    *,
    event_loop: str | None = None,
    env: dict[str, str] | None = None,
    name: str = "leasehold",
    timeout: float = 60.0,
    remote_kinds: tuple[str, ...] = (),
    handlers: tuple[str, ...] = ("bench.handlers",),
    processes: int = 1,
) -> ServerProcess:
    """Start `leasehold serve` with the bench kinds (bench.handlers, or `handlers`) on `database` (a
    SQLite file, or a database URL such as PostgreSQL's) and wait until it listens.
    `concurrency=None` passes no `--concurrency` flag (the server's default), and
    `event_loop=None` no `--event-loop` flag (the server's default); a server that rejects
    the flag makes the figure skipped, not crashed. `remote_kinds` become `--remote-kinds` (the
    in-process runtime then never claims them) and the server gets the bench's worker token, so
    WorkerService answers remote workers and the claim-wakeup client. `processes` above 1
    becomes `--processes` and the server is waited on until every process has started.

    `concurrency=None` is the server at its defaults: no `--concurrency`, `--lease-seconds`,
    `--poll-seconds` or `--log-level` flag, only the listen address, the database URL and
    `--handlers bench.handlers` (without which the bench's kinds would not exist)."""
    url = sqlite_url(database) if isinstance(database, Path) else database
    # A figure's server may hold jobs forever (bench.hold): stopping it must not wait out the
    # production drain's grace (DESIGN §13) before stop()'s own SIGKILL deadline.
    env = {"LEASEHOLD_SHUTDOWN_GRACE": BENCH_SHUTDOWN_GRACE, **(env or {})}
    args = testing.serve_args(url)
    if concurrency is not None:
        args += ["--concurrency", str(concurrency), "--lease-seconds", "30", "--poll-seconds", "1"]
    args += ["--handlers", *handlers]
    if concurrency is not None:
        args += ["--log-level", "info"]
    if event_loop is not None:
        args += ["--event-loop", event_loop]
    if remote_kinds:
        args += ["--remote-kinds", *remote_kinds]
        env = {**worker_env(), **(env or {})}
    if processes > 1:
        args += ["--processes", str(processes)]
    log_path = directory / f"{unique_stem(directory, name)}.log"
    server = ServerProcess(name, args, log_path, env)
    try:
        _await_start(server, timeout)
        if processes > 1:
            wait_until(
                lambda: log_path.read_text().count('"event": "server.started"') >= processes,
                timeout,
                f"{server.name}: all {processes} processes to start",
            )
    except ServerExited as exc:
        if (
            event_loop is not None
            and exc.code == 2
            and ("event-loop" in exc.log_tail or "event_loop" in exc.log_tail)
        ):
            raise FigureSkipped(f"the server rejects --event-loop {event_loop}") from None
        raise
    except BaseException:
        server.stop()
        raise
    return server


def default_concurrency() -> int:
    """`serve`'s execution slots when no `--concurrency` flag (and no LEASEHOLD_CONCURRENCY) is
    given, read from the CLI's own settings code, so the bench follows if the default changes."""
    from leasehold._server.cli import main, serve

    saved = {key: os.environ.pop(key) for key in list(os.environ) if key.startswith("LEASEHOLD_")}
    try:
        return serve.settings_from(main.parser().parse_args(["serve"])).runtime.concurrency
    finally:
        os.environ.update(saved)


def noop_server(directory: Path, stream_messages: int, event_loop: str = "asyncio") -> ServerProcess:
    """Start the no-op gRPC baseline (bench.baselines.grpc_noop) and wait until it listens."""
    args = [sys.executable, "-m", "bench.baselines.grpc_noop", "--stream-messages", str(stream_messages)]
    args += ["--event-loop", event_loop]
    log_path = directory / f"{unique_stem(directory, f'noop-{event_loop}')}.log"
    server = ServerProcess(f"noop-{event_loop}", args, log_path)
    try:
        _await_start(server, 30.0)
    except BaseException:
        server.stop()
        raise
    return server


# ----- remote workers -----------------------------------------------------------------------------

# The one worker token of a bench run (LEASEHOLD_WORKER_TOKEN wants at least 16 characters). It
# guards nothing worth guarding: the servers listen on 127.0.0.1 and live as long as one figure.
WORKER_TOKEN = "bench-worker-token-not-a-secret"


def worker_env() -> dict[str, str]:
    """The environment that lets a process speak WorkerService to a bench server."""
    return {"LEASEHOLD_WORKER_TOKEN": WORKER_TOKEN}


class WorkerProcess:
    """A remote worker process (`leasehold worker` with bench.handlers' kinds, or the bench's Node
    workers, bench/node), running jobs for a server over WorkerService. Ready once it logs
    `worker.started` (it has checked the server with GetServerInfo and its claim loop is about to
    send its first long poll)."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_path
        self.process = _spawn(args, log_path, env)

    def _started(self) -> bool:
        with open(self.log_path, "rb") as log:
            for raw in log:
                if b"worker.started" not in raw:
                    continue
                try:
                    record = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and record.get("event") == "worker.started":
                    return True
        return False

    def wait_started(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._started():
            code = self.process.poll()
            if code is not None and not self._started():
                log_tail = tail(self.log_path)
                if code == 2 and "invalid choice: 'worker'" in log_tail:
                    raise FigureSkipped("this build has no `leasehold worker` command")
                raise BenchError(f"{self.name} exited with status {code} before it started:\n{log_tail}")
            if time.monotonic() >= deadline:
                raise BenchError(f"{self.name} did not start within {timeout:g}s:\n{tail(self.log_path)}")
            time.sleep(0.02)

    def alive(self) -> bool:
        """As ServerProcess.alive: raises with the log's tail once the worker has exited."""
        code = self.process.poll()
        if code is not None:
            raise BenchError(f"{self.name} exited with status {code}:\n{tail(self.log_path)}")
        return True

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGINT (a graceful stop: unfinished jobs are handed back), then SIGKILL."""
        return interrupt(self.process, timeout)


def leasehold_workers(
    directory: Path,
    server: ServerProcess,
    kinds: tuple[str, ...],
    concurrency: int,
    count: int = 1,
    *,
    env: dict[str, str] | None = None,
    name: str = "worker",
    timeout: float = 60.0,
) -> list[WorkerProcess]:
    """Start `count` `leasehold worker` processes with bench.handlers for `kinds` (which `server`
    must route to remote workers) and wait until each is claiming. They start side by side, so a
    second worker costs no second interpreter start-up. Without the command the figure is
    skipped."""
    args = [sys.executable, "-m", "leasehold", "worker", "--server", server.target]
    args += ["--handlers", "bench.handlers", "--kinds", *kinds, "--concurrency", str(concurrency)]
    args += ["--log-level", "info"]
    return start_workers(directory, args, count, env=env, name=name, timeout=timeout)


def start_workers(
    directory: Path,
    args: list[str],
    count: int,
    *,
    env: dict[str, str] | None = None,
    name: str = "worker",
    timeout: float = 60.0,
) -> list[WorkerProcess]:
    """Start `count` worker processes running `args` (any language's worker that logs a JSON
    `worker.started` line on stderr once it is claiming), with the bench's worker token, side by
    side, and wait until each has said so."""
    workers: list[WorkerProcess] = []
    try:
        for _ in range(count):
            stem = unique_stem(directory, name)
            # The log file exists from here on, so the next unique_stem() picks another name.
            workers.append(
                WorkerProcess(stem, args, directory / f"{stem}.log", {**worker_env(), **(env or {})})
            )
        for worker in workers:
            worker.wait_started(timeout)
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def stop_workers(workers: list[WorkerProcess], timeout: float = 15.0) -> None:
    """SIGINT every worker first, then wait for each: their graceful stops overlap."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGINT)
    for worker in workers:
        worker.stop(timeout)


@contextlib.contextmanager
def leasehold_worker(
    directory: Path,
    server: ServerProcess,
    kinds: tuple[str, ...],
    concurrency: int,
    *,
    env: dict[str, str] | None = None,
    name: str = "worker",
) -> Iterator[WorkerProcess]:
    """One worker (see leasehold_workers), stopped on leaving the block."""
    workers = leasehold_workers(directory, server, kinds, concurrency, 1, env=env, name=name)
    try:
        yield workers[0]
    finally:
        stop_workers(workers)


# ----- one-shot Python children -------------------------------------------------------------------


class Child:
    """`python -m bench.child`: calls one function (`module:name`) with JSON keyword arguments in
    its own process and hands back its JSON result through a file (so stray prints or log lines
    on stdout can never corrupt it). Async functions run on `event_loop` (asyncio or uvloop)."""

    def __init__(
        self,
        directory: Path,
        name: str,
        call: str,
        kwargs: dict[str, Any],
        *,
        event_loop: str = "asyncio",
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        stem = unique_stem(directory, name)
        self.log_path = directory / f"{stem}.log"
        self.result_path = directory / f"{stem}.result.json"
        spec_path = directory / f"{stem}.spec.json"
        spec = {"call": call, "kwargs": kwargs, "event_loop": event_loop, "result": str(self.result_path)}
        spec_path.write_text(json.dumps(spec))
        self.process = _spawn([sys.executable, "-m", "bench.child", str(spec_path)], self.log_path, env)

    @property
    def pid(self) -> int:
        return self.process.pid

    def done(self) -> bool:
        return self.process.poll() is not None

    def result(self, timeout: float) -> Any:
        """Wait for the child (killing it after `timeout`) and return its result."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            _reap(self.process)
            raise BenchError(
                f"{self.name} did not finish within {timeout:g}s:\n{tail(self.log_path)}"
            ) from None
        _reap(self.process)
        if code != 0 or not self.result_path.exists():
            raise BenchError(f"{self.name} failed with status {code}:\n{tail(self.log_path, 25)}")
        return json.loads(self.result_path.read_text())["result"]

    def kill(self) -> None:
        _reap(self.process)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def run_child(
    directory: Path,
    name: str,
    call: str,
    kwargs: dict[str, Any],
    timeout: float,
    *,
    event_loop: str = "asyncio",
    env: dict[str, str] | None = None,
) -> Any:
    """Start a Child and wait for its result."""
    with Child(directory, name, call, kwargs, event_loop=event_loop, env=env) as child:
        return child.result(timeout)


def spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Any other child (e.g. the huey consumer), registered for cleanup."""
    return _spawn(args, log_path, env)


def interrupt(process: subprocess.Popen[bytes], timeout: float = 15.0) -> int | None:
    """SIGINT, wait up to `timeout`, then SIGKILL. Returns the exit status (None if killed)."""
    code: int | None = process.poll()
    if code is None:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
    _reap(process)
    return code

"""Helpers for the process-level tests: `leasehold` subprocesses whose raw stderr is
kept, a small synchronous gRPC client, bounded polling and direct reads of the
database (either engine; tests/database_reads.py).

Every subprocess runs with the repository root as its working directory (so
`tests.system.handlers_for_tests` is importable by `--handlers`) and without any
LEASEHOLD_* variable inherited from the developer's shell.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format, struct_pb2

from leasehold.testing import ServerNotStarted, ServerProcess, ServerStarted
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests import database_reads
from tests.credentials import token_file
from tests.support import OWNER, owner_metadata, sqlite_url

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_HANDLERS = ("leasehold.examples", "tests.system.handlers_for_tests")
SECRET_MARKER = "SECRET-MARKER-123"

T = TypeVar("T")

TERMINAL = frozenset(
    {
        jobs_pb2.JOB_STATUS_SUCCEEDED,
        jobs_pb2.JOB_STATUS_FAILED,
        jobs_pb2.JOB_STATUS_CANCELLED,
    }
)


# The process tests were written for a Ctrl-C that gives handlers half a second;
# `serve`'s own default (20 s, DESIGN §13) is for production. A test of the drain
# passes --shutdown-grace, which wins over this.
TEST_SHUTDOWN_GRACE = "0.5"

# How long a test lets a process take to exit once signalled, beyond any grace it was given:
# docs/operations.md (The drain) promises "at once" (idle) and "the grace plus about a
# second" (busy), and a busy CI machine stretches either several times over. This bound only
# tells an exit from a hang or a wait for something long (a lease, a job, serve's default 20 s
# grace); `python -m bench --only shutdown` measures the real figure against the docs'.
EXIT_SECONDS = 15.0


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LEASEHOLD_")}
    env["LEASEHOLD_SHUTDOWN_GRACE"] = TEST_SHUTDOWN_GRACE
    env.update(extra or {})
    return env


def cli_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "leasehold", *args]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run `leasehold ARGS` to completion; stdout and stderr captured as text."""
    return subprocess.run(
        cli_args(*args),
        cwd=REPO_ROOT,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Leasehold:
    """One `leasehold` process (serve, worker or another command), started through
    leasehold.testing.ServerProcess. Keeps every output line (raw and, when it is
    JSON, parsed) for the test to assert on; for serve, `started` is what its
    `server.started` record says."""

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: Path = REPO_ROOT,
        command: tuple[str, ...] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.args = [*command, *args] if command is not None else cli_args(*args)
        # Run in the child before exec, e.g. to lower its resource limits.
        self.preexec_fn = preexec_fn
        self.env = child_env(env)
        self.cwd = cwd
        self.server: ServerProcess | None = None
        self.raw_lines: list[str] = []
        self.records: list[dict[str, Any]] = []

    @classmethod
    def serve(cls, database_url: str, *extra: str, **options: Any) -> Leasehold:
        return cls("serve", "--database-url", database_url, "--listen", "127.0.0.1:0", *extra, **options)

    @classmethod
    def serve_with_tokens(
        cls, directory: Path, roles: tuple[str, ...], *extra: str, **options: Any
    ) -> tuple[Leasehold, Path, list[str]]:
        """`serve --auth token` on a fresh SQLite file in `directory`; its token
        file (returned, to edit) grants each role one token (returned in order)."""
        path, tokens = token_file(directory / "tokens", *roles)
        auth = ("--auth", "token", "--token-file", str(path))
        return cls.serve(sqlite_url(directory), *auth, *extra, **options), path, tokens

    # ----- lifecycle -------------------------------------------------------------

    def launch(self) -> Leasehold:
        self.server = ServerProcess(
            self.args, env=self.env, cwd=self.cwd, on_line=self._keep, preexec_fn=self.preexec_fn
        )
        return self

    def wait_started(self, timeout: float = 30.0) -> int:
        assert self.server is not None, "launch() first"
        try:
            return self.server.wait_started(timeout).port
        except ServerNotStarted as exc:
            raise AssertionError(
                f"leasehold serve did not start ({exc}); output:\n{self.output[-3000:]}"
            ) from None

    def start(self, timeout: float = 30.0) -> int:
        return self.launch().wait_started(timeout)

    def _keep(self, line: str) -> None:
        self.raw_lines.append(line)
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return
        if isinstance(record, dict):
            self.records.append(record)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a crash or the OOM killer."""
        if self.server is not None:
            self.server.kill()

    def interrupt(self, timeout: float = 2 * EXIT_SECONDS, signum: int = signal.SIGINT) -> float:
        """Send SIGINT (Ctrl-C); returns the seconds the process took to exit. The wait is
        longer than EXIT_SECONDS, so a slow exit fails the caller's bound, with its figure."""
        assert self.server is not None
        began = time.monotonic()
        self.server.process.send_signal(signum)
        self.server.process.wait(timeout)
        elapsed = time.monotonic() - began
        self.server.wait(timeout)  # and its output all read
        return elapsed

    def wait_exit(self, timeout: float) -> None:
        """Until the process has exited (after a signal sent through `.process`)
        and its output is all read."""
        assert self.server is not None
        self.server.wait(timeout)

    @property
    def process(self) -> subprocess.Popen[str] | None:
        return None if self.server is None else self.server.process

    @property
    def returncode(self) -> int | None:
        return None if self.server is None else self.server.returncode

    @property
    def port(self) -> int | None:
        return None if self.server is None or self.server.started is None else self.server.started.port

    @property
    def started(self) -> ServerStarted:
        """What serve's `server.started` record says (its address, dashboard, metrics...)."""
        assert self.server is not None and self.server.started is not None, "not started"
        return self.server.started

    # ----- what it said -------------------------------------------------------------

    @property
    def output(self) -> str:
        """Everything the process wrote (stderr, with stdout folded in)."""
        return "".join(self.raw_lines)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [record for record in self.records if record.get("event") == name]

    def events_for(self, name: str, job_id: str) -> list[dict[str, Any]]:
        return [record for record in self.events(name) if record.get("job_id") == job_id]


# ----- polling ------------------------------------------------------------------------


def wait_until(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# ----- gRPC ---------------------------------------------------------------------------


def struct(payload: dict[str, Any]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(payload)
    return value


def event_payload(event: jobs_pb2.JobEvent) -> dict[str, Any]:
    return json_format.MessageToDict(event.payload)


class Client:
    """A synchronous JobService client for one port."""

    def __init__(self, port: int, owner: str = OWNER, host: str = "127.0.0.1") -> None:
        self.channel = grpc.insecure_channel(f"{host}:{port}")
        self.stub = jobs_pb2_grpc.JobServiceStub(self.channel)
        self.metadata = owner_metadata(owner)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enqueue(self, kind: str, payload: dict[str, Any] | None = None, **fields: Any) -> jobs_pb2.Job:
        request = jobs_pb2.EnqueueRequest(kind=kind, payload=struct(payload or {}), **fields)
        return self.stub.Enqueue(request, metadata=self.metadata, timeout=10).job

    def get(self, job_id: str) -> jobs_pb2.Job:
        return self.stub.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=self.metadata, timeout=10).job

    def cancel(self, job_id: str) -> jobs_pb2.Job:
        return self.stub.Cancel(jobs_pb2.CancelRequest(job_id=job_id), metadata=self.metadata, timeout=10).job

    def list_all(self, **filters: Any) -> list[jobs_pb2.Job]:
        found: list[jobs_pb2.Job] = []
        token = ""
        while True:
            response = self.stub.List(
                jobs_pb2.ListRequest(page_size=500, page_token=token, **filters),
                metadata=self.metadata,
                timeout=10,
            )
            found.extend(response.jobs)
            token = response.next_page_token
            if not token:
                return found

    def watch(self, job_id: str, after_sequence: int = 0, timeout: float = 60.0) -> Any:
        """The WatchEvents call: iterate it for events; `.cancel()` it to stop early."""
        return self.stub.WatchEvents(
            jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=after_sequence),
            metadata=self.metadata,
            timeout=timeout,
        )

    def events_until(
        self, job_id: str, stop: Callable[[jobs_pb2.JobEvent], bool], timeout: float = 30.0
    ) -> list[jobs_pb2.JobEvent]:
        """Read the job's log from the start until `stop(event)` holds, then hang up."""
        call = self.watch(job_id, 0, timeout)
        seen: list[jobs_pb2.JobEvent] = []
        try:
            for response in call:
                seen.append(response.event)
                if stop(response.event):
                    return seen
        finally:
            call.cancel()
        raise AssertionError(f"stream of {job_id} ended without the awaited event: {types(seen)}")

    def all_events(self, job_id: str, timeout: float = 60.0) -> list[jobs_pb2.JobEvent]:
        """The whole log: WatchEvents from 0 until the server ends the stream, which it
        does after the terminal event (so this also waits for the job to finish)."""
        return [response.event for response in self.watch(job_id, 0, timeout)]

    def wait_terminal(self, job_id: str, timeout: float = 30.0) -> jobs_pb2.Job:
        return wait_until(
            lambda: (job := self.get(job_id)).status in TERMINAL and job,
            timeout,
            f"job {job_id} to finish",
        )


def types(events: list[jobs_pb2.JobEvent]) -> list[str]:
    return [event.type for event in events]


def assert_gap_free(events: list[jobs_pb2.JobEvent]) -> None:
    sequences = [event.sequence for event in events]
    assert sequences == list(range(1, len(events) + 1)), sequences


# ----- the database, read directly ---------------------------------------------------


def sqlite_path(database_url: str) -> Path:
    """The file behind a SQLite `database_url` (for the checks that are about the
    file itself: it exists, its WAL, its locks). Asserts the URL is SQLite's."""
    prefix = "sqlite+aiosqlite:///"
    assert database_url.startswith(prefix), database_url
    return Path(database_url[len(prefix) :])


def job_row(database_url: str, job_id: str) -> dict[str, Any]:
    """The job's row as stored, lease columns included (the API never shows them),
    on either engine; a SQLite file is opened read-only, so a crashed file is left
    for the next server exactly as the crash left it."""
    found = database_reads.rows(
        database_url,
        "SELECT status, attempt, lease_owner, lease_token, lease_expires_at FROM jobs WHERE id = :job_id",
        job_id=job_id,
    )
    assert found, f"job {job_id} is not in the database"
    return found[0]


def table_names(database_url: str) -> set[str]:
    """The tables of the database, on either engine."""
    return database_reads.table_names(database_url)


def iter_records(directory: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)

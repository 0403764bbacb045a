"""`leasehold jobs follow` against a real service: the feed as JSON lines and as
text, its filters, resuming with --after, Ctrl-C as its clean end (exit 0), its
refusals with their exit statuses, a restart of its one server ridden through
with every event once, and a --wait that gives up with the command that
resumes."""

from __future__ import annotations

import asyncio
import json
import queue
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from leasehold._server.app import LeaseholdApp
from tests.postgres_cluster import free_port
from tests.support import sqlite_url
from tests.system.helpers import REPO_ROOT, Leasehold, child_env, cli_args, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LINE_SECONDS = 30.0  # how long a test waits for the next line a follower prints
FIELDS = {
    "position",
    "job_id",
    "sequence",
    "type",
    "payload",
    "created_at",
    "kind",
    "resource_type",
    "resource_id",
}
LIFECYCLE = ["job.queued", "job.started", "echo", "job.succeeded"]


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """For the service in this process (the `app` fixture): one SQLite file."""
    return sqlite_url(tmp_path)


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """One `leasehold serve` (owners by header): each test follows an owner of its own."""
    process = Leasehold.serve(sqlite_url(tmp_path_factory.mktemp("follow")))
    try:
        yield process.start()
    finally:
        process.kill()


def env_for(port: int, owner: str) -> dict[str, str]:
    return {"LEASEHOLD_SERVER": f"127.0.0.1:{port}", "LEASEHOLD_OWNER": owner}


def enqueue(env: dict[str, str], kind: str, *args: str) -> str:
    made = run_cli("jobs", "enqueue", kind, *args, "-o", "json", env=env)
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["job"]["id"])


class Follower:
    """`leasehold jobs follow ARGS` running: its lines as they are printed (read
    by a thread), its stderr once it has exited."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen(
            cli_args("jobs", "follow", *args),
            cwd=REPO_ROOT, env=child_env(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def until(self, done: Callable[[str], bool]) -> None:
        """Take printed lines until one satisfies `done`."""
        while not (self.lines and done(self.lines[-1])):
            line = self._lines.get(timeout=LINE_SECONDS)
            assert line is not None, f"the follower ended early: {self.finish(10)}"
            self.lines.append(line)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def interrupt(self) -> str:
        """Ctrl-C, then wait for the exit; returns stderr."""
        self.process.send_signal(signal.SIGINT)
        return self.finish(LINE_SECONDS)

    def finish(self, timeout: float) -> str:
        """Wait for the exit, take the remaining lines; returns stderr."""
        self.process.wait(timeout)
        while (line := self._lines.get(timeout=10)) is not None:
            self.lines.append(line)
        return self.process.stderr.read() if self.process.stderr else ""

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def succeeded(job_id: str) -> Callable[[str], bool]:
    def done(line: str) -> bool:
        event = json.loads(line)
        return bool(event["job_id"] == job_id and event["type"] == "job.succeeded")

    return done


# ----- one server --------------------------------------------------------------------


def test_follow_prints_one_json_object_an_event_and_ctrl_c_ends_it_cleanly(port: int) -> None:
    env = env_for(port, "follow-json")
    follower = Follower(env, "--output", "json")
    try:
        job_id = enqueue(env, "example.echo", "--resource", "invoice/42", "--payload", '{"n": 7}')
        follower.until(succeeded(job_id))
        stderr = follower.interrupt()
    finally:
        follower.kill()

    assert follower.process.returncode == 0, stderr
    assert stderr == ""
    events = follower.events()
    assert all(set(event) == FIELDS for event in events), events
    assert [(e["job_id"], e["sequence"], e["type"]) for e in events] == [
        (job_id, n + 1, kind) for n, kind in enumerate(LIFECYCLE)
    ]
    assert {(e["kind"], e["resource_type"], e["resource_id"]) for e in events} == {
        ("example.echo", "invoice", "42")
    }
    assert events[1]["payload"] == {"attempt": 1}  # job.started, its number an integer
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", e["created_at"]) for e in events), events
    positions = [e["position"] for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)

    # Resuming after the second event's position prints from the third on.
    resumed = Follower(env, "--output", "json", "--after", positions[1])
    try:
        resumed.until(succeeded(job_id))
        resumed.interrupt()
    finally:
        resumed.kill()
    assert [e["position"] for e in resumed.events()] == positions[2:]


def test_follow_prints_a_line_an_event_with_the_filters_applied(port: int) -> None:
    env = env_for(port, "follow-text")
    first = enqueue(env, "example.echo", "--resource", "invoice/1")
    enqueue(env, "example.echo")  # no resource: filtered out
    enqueue(env, "example.sleep", "--resource", "invoice/2", "--payload", '{"seconds": 0}')  # another kind
    last = enqueue(env, "example.echo", "--resource", "invoice/3")
    follower = Follower(
        env, "--kind", "example.echo", "--kind", "example.none", "--type", "job.succeeded",
        "--type", "job.queued", "--resource-type", "invoice",
    )  # fmt: skip
    try:
        follower.until(lambda line: last in line and "job.succeeded" in line)
        stderr = follower.interrupt()
    finally:
        follower.kill()

    assert follower.process.returncode == 0, stderr
    line = re.compile(
        r"(?P<position>[0-9a-f]{16}) \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (?P<job>job_\w+) "
        r"example\.echo (?P<type>job\.queued|job\.succeeded)( \{.*\})?"
    )
    matches = [line.fullmatch(text) for text in follower.lines]
    assert all(matches), follower.lines
    shown = [(match["job"], match["type"]) for match in matches if match]
    assert sorted(shown) == sorted(
        [(first, "job.queued"), (first, "job.succeeded"), (last, "job.queued"), (last, "job.succeeded")]
    )


def test_follow_refusals_have_their_exit_statuses(port: int) -> None:
    env = env_for(port, "follow-refused")
    both = run_cli("jobs", "follow", "--after", "0000000000000001", "--tail", env=env)
    assert both.returncode == 2, both.stderr
    assert both.stderr.startswith("leasehold: after: --after and --tail") and both.stdout == ""

    malformed = run_cli("jobs", "follow", "--after", "not-a-position", env=env)
    assert malformed.returncode == 4, malformed.stderr
    (line,) = malformed.stderr.splitlines()
    assert line.startswith("leasehold: INVALID_ARGUMENT: ") and "after_position" in line

    bad_kind = run_cli("jobs", "follow", "--kind", "Not A Kind", env=env)
    assert bad_kind.returncode == 4, bad_kind.stderr
    assert "kinds[0]" in bad_kind.stderr and "Traceback" not in bad_kind.stderr


async def test_an_expired_position_prints_the_services_message_and_exits_4(app: LeaseholdApp) -> None:
    env = env_for(app.port, "follow-expired")

    async def follow(*args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            *cli_args("jobs", "follow", "--output", "json", *args),
            cwd=REPO_ROOT, env=child_env(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        if args:  # resuming from an expired position: it ends by itself
            out, err = await asyncio.wait_for(process.communicate(), LINE_SECONDS)
            assert process.returncode is not None
            return process.returncode, out.decode(), err.decode()
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), LINE_SECONDS)
        process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.wait(), LINE_SECONDS)
        return 0, line.decode(), ""

    job_id = await asyncio.to_thread(enqueue, env, "example.echo")
    _, first, _ = await follow()
    stored = json.loads(first)
    assert stored["job_id"] == job_id
    await asyncio.to_thread(run_cli, "jobs", "watch", job_id, env=env)  # until it has ended
    assert app.repository is not None
    # Retention as the service runs it, with everything finished counted as old.
    assert await app.repository.delete_expired(app.clock.now() + timedelta(seconds=1), 100) == 1

    status, out, err = await follow("--after", stored["position"])
    assert status == 4, err
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("leasehold: OUT_OF_RANGE: ")
    # The service's message names the oldest position kept, past the one that expired.
    named = re.findall(r"\b[0-9a-f]{16}\b", line)
    assert any(position > stored["position"] for position in named), line


# ----- a restart of the server ---------------------------------------------------------


def serve_on_port(
    processes: Callable[[Leasehold], Leasehold], database_url: str, port: int, *flags: str
) -> Leasehold:
    listen = ("--database-url", database_url, "--listen", f"127.0.0.1:{port}", "--lease-seconds", "6")
    return processes(Leasehold("serve", *listen, *flags))


def test_follow_rides_through_a_restart_of_its_one_server(tmp_path: Path, processes) -> None:
    """SIGTERM (a drain) and a new `serve` on the same port and file while `jobs
    follow` runs, with no --wait: it reconnects, says so in one line, and prints
    every event once, resuming after the last position it printed."""
    database_url, server_port = sqlite_url(tmp_path), free_port()
    first = serve_on_port(processes, database_url, server_port, "--shutdown-grace", "0.2")
    first.start()
    env = env_for(server_port, "follow-restart")
    follower = Follower(env, "--output", "json")
    try:
        job_id = enqueue(env, "example.sleep", "--payload", '{"seconds": 4, "steps": 8}')
        follower.until(lambda line: json.loads(line)["sequence"] >= 4)  # mid-run: progress is flowing
        first.interrupt(timeout=20, signum=signal.SIGTERM)
        serve_on_port(processes, database_url, server_port).start()
        follower.until(succeeded(job_id))
        stderr = follower.interrupt()
    finally:
        follower.kill()

    assert follower.process.returncode == 0, stderr
    events = follower.events()
    assert [event["sequence"] for event in events] == list(range(1, len(events) + 1))
    assert "job.released" in [event["type"] for event in events]  # handed back by the drain, run again
    positions = [event["position"] for event in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    (notice,) = stderr.splitlines()
    found = re.fullmatch(
        rf"leasehold: reconnected to 127\.0\.0\.1:{server_port}, resuming after position ([0-9a-f]{{16}})",
        notice,
    )
    assert found is not None, stderr
    assert found.group(1) in positions[3:-1]


def test_follow_given_wait_gives_up_with_exit_5_and_the_command_that_resumes(
    tmp_path: Path, processes
) -> None:
    database_url, server_port = sqlite_url(tmp_path), free_port()
    server = serve_on_port(processes, database_url, server_port, "--shutdown-grace", "0.2")
    server.start()
    env = env_for(server_port, "follow-gives-up")
    follower = Follower(env, "--output", "json", "--kind", "example.echo", "--wait", "0.5")
    try:
        job_id = enqueue(env, "example.echo")
        follower.until(succeeded(job_id))
        server.interrupt(timeout=20, signum=signal.SIGTERM)
        stderr = follower.finish(60)
    finally:
        follower.kill()

    assert follower.process.returncode == 5, stderr
    last = follower.events()[-1]["position"]
    (line,) = stderr.splitlines()
    assert line.startswith(
        f"leasehold: UNAVAILABLE: no answer from 127.0.0.1:{server_port} within --wait 0.5 s"
    )
    assert line.endswith(f"`leasehold jobs follow --kind example.echo --after {last}` resumes it")

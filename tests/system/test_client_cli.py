"""`leasehold jobs|schedules|admin` against a real `leasehold serve` (token auth, so
--token and the admin role are real), in both output modes, with their exit
statuses; `jobs watch` under a pseudo-terminal draws an advancing progress bar,
and rides through a restart of its server."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import queue
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.credentials import Authority, token_file
from tests.postgres_cluster import free_port
from tests.support import OWNER, sqlite_url
from tests.system.helpers import REPO_ROOT, Leasehold, child_env, cli_args, run_cli

pytestmark = pytest.mark.slow

# Not due for a month: such a job stays queued whatever the test does.
FUTURE = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0).isoformat()


class Cli:
    """`leasehold ARGS` as one caller of one server."""

    def __init__(self, port: int, token: str) -> None:
        self.env = {"LEASEHOLD_SERVER": f"127.0.0.1:{port}", "LEASEHOLD_TOKEN": token}

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={**self.env, **(env or {})}, timeout=60)

    def ok(self, *args: str) -> str:
        result = self(*args)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", result.stderr
        return result.stdout

    def json(self, *args: str) -> list[dict[str, Any]]:
        """The command's JSON lines (checking there is nothing else)."""
        return [json.loads(line) for line in self.ok(*args, "--output", "json").splitlines()]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, list[str]]]:
    directory = tmp_path_factory.mktemp("cli")
    path, tokens = token_file(
        directory / "tokens", "owner:alice", "owner:bob", "admin", "owner:carol", "owner:dave"
    )
    process = Leasehold.serve(sqlite_url(directory), "--auth", "token", "--token-file", str(path))
    try:
        yield process.start(), tokens
    finally:
        process.kill()


@pytest.fixture
def alice(server: tuple[int, list[str]]) -> Cli:
    return Cli(server[0], server[1][0])


@pytest.fixture
def bob(server: tuple[int, list[str]]) -> Cli:
    return Cli(server[0], server[1][1])


@pytest.fixture
def admin(server: tuple[int, list[str]]) -> Cli:
    return Cli(server[0], server[1][2])


@pytest.fixture
def carol(server: tuple[int, list[str]]) -> Cli:
    """An owner only `jobs stats` acts as, so its counts are exactly its own test's."""
    return Cli(server[0], server[1][3])


@pytest.fixture
def dave(server: tuple[int, list[str]]) -> Cli:
    """An owner only the graph test acts as, so `jobs get` lists exactly its jobs' children."""
    return Cli(server[0], server[1][4])


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr + result.stdout
    assert lines and lines[-1].startswith(("leasehold: ", "leasehold ")), result.stderr
    for word in words:
        assert word in lines[-1], result.stderr


# ----- jobs ------------------------------------------------------------------------------


def test_enqueue_get_and_list_in_both_modes(alice: Cli, bob: Cli, tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text('{"n": 7}')
    (created,) = alice.json("jobs", "enqueue", "example.echo", "--payload", f"@{payload}", "--priority", "2")
    job_id = created["job"]["id"]
    assert created["created"] is True and created["job"]["priority"] == 2
    text = alice.ok("jobs", "enqueue", "example.echo", "--resource", "doc/42", "--run-at", FUTURE)
    assert re.fullmatch(r"enqueued: job_\w+\n", text), text
    again = alice.ok("jobs", "enqueue", "example.echo", "--resource", "doc/42")
    assert again.startswith("already enqueued") and text.split()[-1] == again.split()[-1]
    scheduled = text.split()[-1]

    (got,) = alice.json("jobs", "get", scheduled)
    assert (got["id"], got["resourceType"], got["resourceId"]) == (scheduled, "doc", "42")
    assert got["runAt"] == FUTURE.replace("+00:00", "Z")
    table = alice.ok("jobs", "get", scheduled)
    assert re.search(r"status\s+queued", table) and re.search(r"waiting\s+scheduled", table)
    assert re.search(r"resource\s+doc/42", table)

    listed = alice.json("jobs", "list")
    assert {job["id"] for job in listed} == {job_id, scheduled}
    assert [job["id"] for job in alice.json("jobs", "list", "--limit", "1")] == [listed[0]["id"]]
    queued = alice.json("jobs", "list", "--status", "queued", "--kind", "example.echo")
    assert [job["id"] for job in queued] == [scheduled]
    rows = alice.ok("jobs", "list").splitlines()
    assert rows[0].split() == ["ID", "KIND", "STATUS", "ATTEMPT", "RESOURCE", "CREATED"]
    assert {row.split()[0] for row in rows[1:]} == {job_id, scheduled}  # whole ids, never cut short
    assert bob.json("jobs", "list") == []  # another owner's jobs do not show


def test_cancel_retry_and_watch_exit_codes(alice: Cli) -> None:
    scheduled = alice.json("jobs", "enqueue", "example.echo", "--run-at", FUTURE)[0]["job"]["id"]
    (cancelled,) = alice.json("jobs", "cancel", scheduled)
    assert cancelled["status"] == "JOB_STATUS_CANCELLED"
    assert alice("jobs", "watch", scheduled).returncode == 3
    assert alice("jobs", "watch", scheduled, "--output", "json").returncode == 3

    retried = alice.ok("jobs", "retry", scheduled)
    assert re.search(rf"retry of\s+{scheduled}", retried), retried
    new_id = re.search(r"id\s+(job_\w+)", retried)
    assert new_id is not None and new_id.group(1) != scheduled
    assert re.search(r"status\s+cancelled", alice.ok("jobs", "cancel", new_id.group(1)))

    succeeded = alice("jobs", "enqueue", "example.echo", "--watch", "--output", "json")
    assert succeeded.returncode == 0, succeeded.stderr
    enqueued, *events = [json.loads(line) for line in succeeded.stdout.splitlines()]
    assert [event["sequence"] for event in events] == [str(n) for n in range(1, len(events) + 1)]
    assert events[-1]["type"] == "job.succeeded"
    after = alice("jobs", "watch", enqueued["job"]["id"], "--after", "2", "--output", "json")
    assert after.returncode == 0
    assert [json.loads(line) for line in after.stdout.splitlines()] == events[2:]

    failing = alice("jobs", "enqueue", "example.fail", "--payload", '{"message": "boom"}', "--watch")
    assert failing.returncode == 1, failing.stderr
    assert "job.failed" in failing.stdout and "boom" in failing.stdout

    text = alice.ok(
        "jobs", "cancel", alice.json("jobs", "enqueue", "example.echo", "--run-at", FUTURE)[0]["job"]["id"]
    )
    assert re.search(r"status\s+cancelled", text)


def test_after_makes_a_child_and_get_shows_its_parents_and_children(dave: Cli) -> None:
    parent = dave.json("jobs", "enqueue", "example.echo", "--run-at", FUTURE)[0]["job"]["id"]
    (made,) = dave.json("jobs", "enqueue", "example.echo", "--after", parent, "--on-parent-failure", "run")
    runs_anyway = made["job"]
    assert (runs_anyway["dependsOn"], runs_anyway["pendingDependencies"]) == ([parent], 1)
    assert runs_anyway["onParentFailure"] == "PARENT_FAILURE_POLICY_RUN" and "availableAt" not in runs_anyway
    text = dave.ok("jobs", "enqueue", "example.echo", "--after", parent, "--after", runs_anyway["id"])
    assert re.fullmatch(r"enqueued: job_\w+\n", text), text
    cancels = text.split()[-1]

    (got,) = dave.json("jobs", "get", cancels)
    assert got["waitReason"] == "WAIT_REASON_DEPENDENCIES" and got["pendingDependencies"] == 2
    assert got["parents"] == [
        {"id": parent, "status": "JOB_STATUS_QUEUED"},
        {"id": runs_anyway["id"], "status": "JOB_STATUS_QUEUED"},
    ]
    assert (got["children"], got["moreChildren"]) == ([], False)
    (top,) = dave.json("jobs", "get", parent)
    assert top["parents"] == []
    assert top["children"] == [  # newest first, as List has them
        {"id": cancels, "status": "JOB_STATUS_QUEUED"},
        {"id": runs_anyway["id"], "status": "JOB_STATUS_QUEUED"},
    ]
    table = dave.ok("jobs", "get", cancels)
    assert re.search(r"waiting\s+dependencies", table) and re.search(
        r"depends on\s+2 jobs, waiting for 2", table
    )
    assert re.search(r"on parent failure\s+cancel", table)
    assert re.search(rf"parents\s+ID\s+STATUS\s+{parent}\s+queued\s+{runs_anyway['id']}\s+queued", table)
    assert "children" not in table
    assert re.search(rf"children\s+ID\s+STATUS\s+{cancels}\s+queued", dave.ok("jobs", "get", parent))
    listed = dave.json("jobs", "list", "--depends-on", parent)
    assert [job["id"] for job in listed] == [cancels, runs_anyway["id"]]

    dave.ok("jobs", "cancel", parent)
    assert dave("jobs", "watch", runs_anyway["id"]).returncode == 0  # run: it ran all the same
    assert dave("jobs", "watch", cancels).returncode == 3
    (ended,) = dave.json("jobs", "get", cancels)
    assert ended["errorType"] == "DependencyFailed" and parent in ended["errorMessage"]
    assert [relative["status"] for relative in ended["parents"]] == [
        "JOB_STATUS_CANCELLED",
        "JOB_STATUS_SUCCEEDED",
    ]

    assert_one_line_error(
        dave("jobs", "enqueue", "example.echo", "--after", "job_absent"), 4, "depends_on[0]"
    )
    assert_one_line_error(
        dave("jobs", "enqueue", "example.echo", "--after", parent, "--on-parent-failure", "skip"), 2, "skip"
    )


def test_stats_count_every_job_of_the_caller_in_both_modes(carol: Cli, alice: Cli) -> None:
    alice.ok("jobs", "enqueue", "example.sleep", "--run-at", FUTURE)  # another owner's: never counted
    for _ in range(2):
        carol.ok("jobs", "enqueue", "example.echo", "--run-at", FUTURE)
    assert carol("jobs", "enqueue", "example.echo", "--watch").returncode == 0
    carol.ok(
        "jobs", "cancel", carol.json("jobs", "enqueue", "example.sleep", "--run-at", FUTURE)[0]["job"]["id"]
    )

    (stats,) = carol.json("jobs", "stats")
    assert stats["total"] == {"queued": "2", "succeeded": "1", "cancelled": "1"}
    assert stats["kinds"] == [
        {"kind": "example.echo", "counts": {"queued": "2", "succeeded": "1"}},
        {"kind": "example.sleep", "counts": {"cancelled": "1"}},
    ]
    assert "computedAt" in stats and "kindsTruncated" not in stats
    rows = [line.split() for line in carol.ok("jobs", "stats").splitlines()]
    assert rows == [
        ["KIND", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"],
        ["example.echo", "2", "0", "1", "0", "0"],
        ["example.sleep", "0", "0", "0", "0", "1"],
        ["(all", "kinds)", "2", "0", "1", "0", "1"],
    ]


def test_mistakes_are_one_line_with_their_exit_status(
    alice: Cli, bob: Cli, server: tuple[int, list[str]]
) -> None:
    mine = alice.json("jobs", "enqueue", "example.echo", "--run-at", FUTURE)[0]["job"]["id"]
    assert_one_line_error(bob("jobs", "get", mine), 4, "PERMISSION_DENIED", "not found or not accessible")
    assert_one_line_error(alice("jobs", "enqueue", "no.such.kind"), 4, "INVALID_ARGUMENT", "kind")
    assert_one_line_error(alice("jobs", "cancel", "job_absent"), 4, "job_absent")
    assert_one_line_error(
        alice("jobs", "get", mine, env={"LEASEHOLD_TOKEN": "wrong" * 8}), 4, "UNAUTHENTICATED"
    )
    usage = [
        (("jobs", "enqueue", "example.echo", "--payload", "{nope"), "--payload"),
        (("jobs", "enqueue", "example.echo", "--payload", "[1]"), "JSON object"),
        (("jobs", "enqueue", "example.echo", "--payload", "@/no/such/file"), "--payload @/no/such/file"),
        (("jobs", "enqueue", "example.echo", "--resource", "nokey"), "--resource"),
        (("jobs", "enqueue", "example.echo", "--run-at", "tomorrow"), "--run-at"),
        (("jobs", "enqueue", "example.echo", "--run-at", "2030-01-01T00:00:00"), "zone"),
        (("jobs", "list", "--status", "sleeping"), "--status"),
        (("jobs", "list", "--output", "yaml"), "output"),
        (("jobs", "list", "--tls-client-cert", "x.pem"), "--tls-client-key"),
        (("jobs", "get"), "ID"),
        (("jobs", "frobnicate"), "frobnicate"),
    ]
    for args, word in usage:
        assert_one_line_error(alice(*args), 2, word)
    unreachable = alice("jobs", "list", "--server", "127.0.0.1:1", "--wait", "0.5")
    assert_one_line_error(unreachable, 5, "UNAVAILABLE")


def test_flags_come_from_the_environment_and_the_command_line_wins(alice: Cli) -> None:
    job_id = alice.json("jobs", "enqueue", "example.echo", "--run-at", FUTURE)[0]["job"]["id"]
    as_json = alice("jobs", "get", job_id, env={"LEASEHOLD_OUTPUT": "json"})
    assert json.loads(as_json.stdout)["id"] == job_id
    as_table = alice("jobs", "get", job_id, "--output", "table", env={"LEASEHOLD_OUTPUT": "json"})
    assert as_table.stdout.split()[:2] == ["FIELD", "VALUE"]


def test_owner_header_mode(tmp_path: Path, processes) -> None:
    port = processes(Leasehold.serve(sqlite_url(tmp_path))).start()
    env = {"LEASEHOLD_SERVER": f"127.0.0.1:{port}"}
    made = run_cli("jobs", "enqueue", "example.echo", "--owner", "carol", "-o", "json", env=env)
    job = json.loads(made.stdout)["job"]
    assert job["ownerId"] == "carol"
    seen = run_cli("jobs", "list", "-o", "json", env={**env, "LEASEHOLD_OWNER": "carol"})
    assert [json.loads(line)["id"] for line in seen.stdout.splitlines()] == [job["id"]]


def test_tls_flags_with_a_client_certificate(tmp_path: Path, processes) -> None:
    authority = Authority(tmp_path)
    cert, carol = authority.server(), authority.client("carol")
    server = Leasehold.serve(
        sqlite_url(tmp_path), "--auth", "mtls", "--tls-client-ca", str(authority.cert_file),
        "--tls-cert", str(cert.cert_file), "--tls-key", str(cert.key_file),
    )  # fmt: skip
    env = {
        "LEASEHOLD_SERVER": f"127.0.0.1:{processes(server).start()}",
        "LEASEHOLD_TLS_CA": str(authority.cert_file),
    }
    flags = ("--tls-client-cert", str(carol.cert_file), "--tls-client-key", str(carol.key_file))
    made = run_cli("jobs", "enqueue", "example.echo", *flags, "-o", "json", env=env)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["job"]["ownerId"] == "carol"
    assert_one_line_error(run_cli("jobs", "list", "--wait", "0", env=env), 5, "UNAVAILABLE")


# ----- schedules -------------------------------------------------------------------------


def test_schedules_commands_in_both_modes(alice: Cli) -> None:
    (created,) = alice.json(
        "schedules", "create", "nightly", "--cron", "0 3 * * *", "--kind", "example.echo",
        "--payload", '{"n": 1}', "--time-zone", "Europe/Paris", "--overlap", "allow",
    )  # fmt: skip
    assert (created["scheduleId"], created["timeZone"], created["overlap"]) == (
        "nightly",
        "Europe/Paris",
        "OVERLAP_POLICY_ALLOW",
    )
    table = alice.ok("schedules", "list")
    assert table.splitlines()[0].split()[:3] == ["ID", "CRON", "ZONE"]
    assert "nightly" in table and "0 3 * * *" in table
    assert alice.json("schedules", "pause", "nightly")[0]["paused"] is True
    assert "yes" in alice.ok("schedules", "get", "nightly")
    assert alice.json("schedules", "resume", "nightly")[0].get("paused", False) is False
    (fired,) = alice.json("schedules", "trigger", "nightly")
    assert fired["job"]["kind"] == "example.echo" and fired["schedule"]["lastJobId"] == fired["job"]["id"]
    assert alice.ok("schedules", "trigger", "nightly").startswith("triggered: nightly enqueued job_")
    assert [s["scheduleId"] for s in alice.json("schedules", "list")] == ["nightly"]
    assert alice.ok("schedules", "delete", "nightly") == "deleted: nightly\n"
    assert_one_line_error(alice("schedules", "get", "nightly"), 4, "nightly")
    assert alice.json("schedules", "list") == []


# ----- admin -----------------------------------------------------------------------------


def test_admin_commands_in_both_modes(alice: Cli, bob: Cli, admin: Cli) -> None:
    kind = "example.echo"
    held = [caller.json("jobs", "enqueue", kind, "--run-at", FUTURE, "--resource", f"adm/{n}")[0]["job"]["id"]
            for n, caller in enumerate((alice, bob, bob))]  # fmt: skip

    (stats,) = admin.json("admin", "stats")
    echo = next(row for row in stats["kinds"] if row["kind"] == kind)
    assert int(echo["queued"]) >= 3
    table = admin.ok("admin", "stats")
    assert "KIND" in table and kind in table

    assert_one_line_error(alice("admin", "stats"), 4, "PERMISSION_DENIED")

    assert admin.json("admin", "pause", kind) == [{"kind": kind, "paused": True}]
    assert next(r for r in admin.json("admin", "stats")[0]["kinds"] if r["kind"] == kind)["paused"] is True
    assert admin.ok("admin", "resume", kind) == f"{kind}: resumed\n"

    filters = ("--owner-id", "bob", "--kind", kind, "--status", "queued")
    assert admin.json("admin", "bulk-cancel", *filters, "--dry-run") == [{"matched": "2", "dryRun": True}]
    assert alice.json("jobs", "get", held[0])[0]["status"] == "JOB_STATUS_QUEUED"
    assert admin.ok("admin", "bulk-cancel", *filters) == "cancelled 2 jobs\n"
    assert {bob.json("jobs", "get", job)[0]["status"] for job in held[1:]} == {"JOB_STATUS_CANCELLED"}
    assert alice.json("jobs", "get", held[0])[0]["status"] == "JOB_STATUS_QUEUED"
    retry = ("--owner-id", "bob", "--kind", kind)
    assert admin.ok("admin", "bulk-retry", *retry, "--dry-run").startswith("would retry 2 jobs")
    assert admin.json("admin", "bulk-retry", *retry) == [{"matched": "2"}]
    assert_one_line_error(admin("admin", "bulk-cancel", "--status", "succeeded"), 4, "INVALID_ARGUMENT")
    # No kind, owner or resource: every owner's jobs. Counting is free; acting takes --all.
    counted = admin.json("admin", "bulk-cancel", "--dry-run")[0]["matched"]
    assert int(counted) >= 3  # alice's, bob's two retries, and whatever this module's server holds
    refused = admin("admin", "bulk-cancel")
    assert_one_line_error(refused, 4, "INVALID_ARGUMENT")
    assert "confirm_all" in refused.stderr
    assert alice.json("jobs", "get", held[0])[0]["status"] == "JOB_STATUS_QUEUED"  # nothing was touched
    [acted] = admin.json("admin", "bulk-cancel", "--all")
    assert 3 <= int(acted["matched"]) <= int(counted)  # a running job may have ended meanwhile
    assert alice.json("jobs", "get", held[0])[0]["status"] == "JOB_STATUS_CANCELLED"


# ----- the progress bar ------------------------------------------------------------------

STEPS = 6


def run_in_pty(
    args: list[str],
    env: dict[str, str],
    timeout: float,
    on_output: Callable[[bytes], None] | None = None,
) -> tuple[int, bytes]:
    """Run a command with a pseudo-terminal (100 columns) as its stdout and stderr;
    returns its exit status and every byte it wrote. `on_output` is called with all
    written so far after each read, so a test can act once the command has said something."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    process = subprocess.Popen(
        args, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal
    )
    os.close(terminal)
    written = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not chunk:
                break
            written.extend(chunk)
            if on_output is not None:
                on_output(bytes(written))
        elif process.poll() is not None:
            break
    os.close(controller)
    return process.wait(10), bytes(written)


def test_watch_under_a_terminal_draws_an_advancing_progress_bar(alice: Cli, admin: Cli) -> None:
    # The job waits (its kind paused) until the watch has drawn its first event, so the bar
    # advances live: a watch that started after the job's last step, as a slow start of the
    # command can, would get every step in one replay and draw a single frame.
    kind = "example.sleep"
    assert admin.json("admin", "pause", kind) == [{"kind": kind, "paused": True}]
    resumed = False

    def resume_once_watching(written: bytes) -> None:
        nonlocal resumed
        if not resumed and b"job.queued" in written:
            resumed = True
            admin.ok("admin", "resume", kind)

    try:
        payload = json.dumps({"seconds": 3, "steps": STEPS})
        job_id = alice.json("jobs", "enqueue", kind, "--payload", payload)[0]["job"]["id"]
        env = child_env({**alice.env, "TERM": "xterm-256color"})
        env.pop("NO_COLOR", None)
        status, written = run_in_pty(
            cli_args("jobs", "watch", job_id), env, timeout=60, on_output=resume_once_watching
        )
    finally:
        if not resumed:
            admin("admin", "resume", kind)
    assert resumed
    text = written.decode()
    assert status == 0, text
    # rich redraws the bar in place: frames are separated by cursor movements, and
    # each carries the "step/steps" count; they must climb to the last step.
    counts = [int(found) for found in re.findall(rf"(\d+)/{STEPS}\b", text)]
    assert "\x1b[" in text and "━" in text, text
    distinct = list(dict.fromkeys(counts))
    assert len(distinct) >= 3 and distinct == sorted(distinct) and distinct[-1] == STEPS, counts
    assert "job.succeeded" in text and "Traceback" not in text


# ----- a watch across a restart ----------------------------------------------------------


class Watcher:
    """`leasehold jobs watch ID --output json ARGS` running: its events as they are
    printed (read by a thread), its stderr once it has exited."""

    def __init__(self, env: dict[str, str], job_id: str, *args: str) -> None:
        self.process = subprocess.Popen(
            cli_args("jobs", "watch", job_id, "--output", "json", *args),
            cwd=REPO_ROOT, env=child_env(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def until(self, done: Callable[[dict[str, Any]], bool]) -> None:
        """Take printed events until one satisfies `done` (each within 30 s)."""
        while not (self.events and done(self.events[-1])):
            line = self._lines.get(timeout=30)
            assert line is not None, f"the watch ended early: {self.finish(10)}"
            self.events.append(json.loads(line))

    def finish(self, timeout: float) -> str:
        """Wait for the exit, take the remaining events; returns stderr."""
        self.process.wait(timeout)
        while (line := self._lines.get(timeout=10)) is not None:
            self.events.append(json.loads(line))
        return self.process.stderr.read() if self.process.stderr else ""

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


def serve_on_port(
    processes: Callable[[Leasehold], Leasehold], database_url: str, port: int, *flags: str
) -> Leasehold:
    listen = ("--database-url", database_url, "--listen", f"127.0.0.1:{port}", "--lease-seconds", "6")
    return processes(Leasehold("serve", *listen, *flags))


def enqueue_sleep(env: dict[str, str], seconds: int) -> str:
    payload = json.dumps({"seconds": seconds, "steps": 2 * seconds})
    made = run_cli("jobs", "enqueue", "example.sleep", "--payload", payload, "-o", "json", env=env)
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["job"]["id"])


def test_watch_rides_through_a_restart_of_its_one_server(tmp_path: Path, processes) -> None:
    """SIGTERM (a drain) and a new `serve` on the same port and file while `jobs
    watch` is open, with no --wait: it reconnects, says so in one line, resumes
    after the last event it printed and exits 0 when the re-run job succeeds."""
    database_url, port = sqlite_url(tmp_path), free_port()
    first = serve_on_port(processes, database_url, port, "--shutdown-grace", "0.2")
    first.start()
    env = {"LEASEHOLD_SERVER": f"127.0.0.1:{port}", "LEASEHOLD_OWNER": OWNER}
    watcher = Watcher(env, enqueue_sleep(env, 4))
    try:
        watcher.until(lambda event: int(event["sequence"]) >= 4)  # mid-run: progress is flowing
        first.interrupt(timeout=20, signum=signal.SIGTERM)
        serve_on_port(processes, database_url, port).start()
        stderr = watcher.finish(60)
    finally:
        watcher.kill()

    assert watcher.process.returncode == 0, stderr
    events = watcher.events
    assert [int(event["sequence"]) for event in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "job.succeeded"
    assert "job.released" in [event["type"] for event in events]  # handed back by the drain, run again
    (notice,) = stderr.splitlines()
    found = re.fullmatch(
        rf"leasehold: reconnected to 127\.0\.0\.1:{port}, resuming after event (\d+)", notice
    )
    assert found is not None, stderr
    assert 4 <= int(found.group(1)) < len(events)


def test_a_watch_given_wait_gives_up_with_exit_5_and_a_line_a_user_can_act_on(
    tmp_path: Path, processes
) -> None:
    """Its server drained and not started again: after --wait, exit status 5 and
    one line of the command's own, which says how to resume (the draining server's
    advice is for whoever runs several replicas)."""
    database_url, port = sqlite_url(tmp_path), free_port()
    server = serve_on_port(processes, database_url, port, "--shutdown-grace", "0.2")
    server.start()
    env = {"LEASEHOLD_SERVER": f"127.0.0.1:{port}", "LEASEHOLD_OWNER": OWNER}
    job_id = enqueue_sleep(env, 60)
    watcher = Watcher(env, job_id, "--wait", "0.5")
    try:
        watcher.until(lambda event: event["type"] == "job.started")
        server.interrupt(timeout=20, signum=signal.SIGTERM)
        stderr = watcher.finish(60)
    finally:
        watcher.kill()

    assert watcher.process.returncode == 5, stderr
    last = watcher.events[-1]["sequence"]
    (line,) = stderr.splitlines()
    assert line.startswith(f"leasehold: UNAVAILABLE: no answer from 127.0.0.1:{port} within --wait 0.5 s")
    assert line.endswith(f"`leasehold jobs watch {job_id} --after {last}` resumes it")
    assert "replica" not in line

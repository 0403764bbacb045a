"""Experiment 9 — wall-clock jumps.

What is promised (DESIGN §3, §5, §6; docs/jobs.md "Leases and delivery semantics"), and
what a step of the wall clock may and may not do to it:

- Job times (created/available/lease expiry) come from the wall clock; timers
  that pace the process itself (heartbeat interval, handler timeout, idle wait)
  run on the monotonic clock. So a jump of the wall clock moves no timer: a
  heartbeat still comes every lease/3 of real time and renews the lease in the
  new frame, a handler's `timeout_seconds` fires after that many real seconds,
  and an idle claimer still wakes at once on a new Enqueue.
- A forward jump larger than the lease legitimately makes every running lease
  look expired (the wall clock says so). The next claim takes those jobs back
  and runs them again as attempt + 1, possibly while the old attempt is still
  running here for up to lease/3, until its heartbeat or its completion learns
  that the lease is gone. That is at-least-once delivery; what must hold is the
  fencing: the old attempt's completion is rejected, every attempt has exactly
  one closing event, no job succeeds twice, and the lost lease is logged
  (`job.lease_lost`).
- A backward jump makes leases look longer, never shorter: no running attempt may
  lose its lease because of it. Nor may it hold up queued work: a job stamped
  "available at T" by the clock before the step must not wait until the clock
  reads T again (an hour here). A retry backoff may be kept, the step may not
  be added to it.
- Whatever the jumps: nothing acknowledged is lost, every job runs to its end
  within the test's bound, at most one completion is accepted per attempt, and
  every event log stays gap-free.

How: `leasehold serve` (4 slots, 6 s lease, 30 s poll so that only wake-up
signals can start work quickly) runs under libfaketime, LD_PRELOADed with
FAKETIME_TIMESTAMP_FILE (the offset, rewritten atomically by the test),
FAKETIME_NO_CACHE=1 (the file is read on every wall-clock call, so a jump lands
at once), FAKETIME_DONT_FAKE_MONOTONIC=1 (only CLOCK_REALTIME moves) and
FAKETIME_FORCE_MONOTONIC_FIX=0 (below). The test learns that a jump has landed
from the server itself: it enqueues small probe jobs (counted like every other
job) until their `created_at` shows the new offset. Jobs are `test.record`
(1.5 s "short" ones, shorter than a heartbeat interval, so any of them running
at a forward jump ends by offering a stale completion; 9-10 s "long" ones,
longer than the lease, to span a jump on heartbeats). Afterwards the database,
the server's log and the per-execution record files are compared.

Both engines. On PostgreSQL only the server's clock jumps, not the database
server's: every time the service stores or compares comes from its own clock (as
parameters), never from the database's `now()`, so a replica whose clock steps
must behave exactly as the SQLite server does. A statement that used the
database's clock would show here as leases expiring in the wrong frame.

- forward then back: +1 h while short jobs and a long one run, then -1 h (back
  to true time) while another long job runs with work queued behind it.
- below true time: -1 h from true time while a long job, a job that times out
  and queued work are in flight.

libfaketime 0.9.10 (Debian 12, glibc 2.36) does not honour DONT_FAKE_MONOTONIC
everywhere; found while building this:

- `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)` gets a negative deadline,
  so `time.sleep()` fails with EINVAL on Python 3.11+ (wolfcw/libfaketime#426).
  The server never calls `time.sleep` (asyncio sleeps in epoll), so it is
  unaffected.
- `pthread_cond_timedwait` on a CLOCK_MONOTONIC condition variable: with the
  "forced monotonic fix" that its glibc autodetection switches on here, the
  deadline is computed from the faked monotonic clock and lies in the past, so
  every timed wait returns ETIMEDOUT at once (a 200 ms wait returns after 0 ms).
  CPython's GIL waits that way: the server burns CPU when idle and answers
  50-100x slower (1-2 s per Enqueue on a loaded 2-core machine), enough to miss
  heartbeats and lose leases with no jump at all. FAKETIME_FORCE_MONOTONIC_FIX=0
  passes monotonic deadlines through unchanged, which is right for this glibc.
- Without DONT_FAKE_MONOTONIC the monotonic clock jumps with the wall clock
  (moving every asyncio timer) and `threading.Event.wait(timeout)` hangs.

With those settings an Enqueue under libfaketime takes 10-30 ms, as without it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from leasehold.v1 import jobs_pb2
from tests import database_reads
from tests.reliability.conftest import Figures
from tests.reliability.process_helpers import Attempt, LoggedEvent, attempt_history, event_logs, job_rows
from tests.support import require
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import (
    EXIT_SECONDS,
    TERMINAL,
    TEST_HANDLERS,
    Client,
    Leasehold,
    iter_records,
    job_row,
    wait_until,
)

pytestmark = pytest.mark.slow

LIBFAKETIME_CANDIDATES = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/faketime/libfaketime.so.1"),
    Path("/usr/local/lib/faketime/libfaketime.so.1"),
)
HOUR = 3600
LEASE_SECONDS = 6.0
HEARTBEAT_SECONDS = LEASE_SECONDS / 3
CONCURRENCY = 4
SHORT = 1.5  # shorter than a heartbeat interval
LONG = 9.0  # longer than a lease: lives on heartbeats
TIMEOUT_SECONDS = 8
FLAGS = (
    "--lease-seconds",
    str(int(LEASE_SECONDS)),
    "--concurrency",
    str(CONCURRENCY),
    "--poll-seconds",
    "30",
    "--handlers",
    *TEST_HANDLERS,
)
# Bounds, generous for 2 noisy cores.
SLACK = 4.0
ALL_DONE_BOUND = 45.0
IDLE_WAKE_BOUND = 5.0


def libfaketime() -> Path | None:
    return next((path for path in LIBFAKETIME_CANDIDATES if path.exists()), None)


class FakeWallClock:
    """The offset file libfaketime reads on every wall-clock call of the server."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "faketime.rc"
        self.offset = 0
        self.set(0)

    def set(self, offset: int) -> None:
        # Atomically: libfaketime must never read a half-written offset.
        staging = self.path.with_suffix(".staging")
        staging.write_text(f"{offset:+d}\n")
        os.replace(staging, self.path)
        self.offset = offset

    def env(self, library: Path) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(library),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # Without this, libfaketime 0.9.10 turns every timed wait on a
            # CLOCK_MONOTONIC condition variable into one with a deadline in the
            # past (module docstring): CPython's GIL spins, the server slows down
            # a hundredfold and misses heartbeats.
            "FAKETIME_FORCE_MONOTONIC_FIX": "0",
        }


@dataclass
class Run:
    """One server under a fake wall clock, and what the test did to it."""

    server: Leasehold
    client: Client
    clock: FakeWallClock
    database_url: str
    records: Path
    acknowledged: list[str] = field(default_factory=list)
    # (offset, monotonic and true wall time the server was first seen on it)
    jumps: list[tuple[int, float, float]] = field(default_factory=list)

    def enqueue(self, seconds: float, **fields: Any) -> str:
        job_id = self.client.enqueue("test.record", {"seconds": seconds}, **fields).id
        self.acknowledged.append(job_id)
        return job_id

    def probe_offset(self) -> float:
        """Enqueue a probe job; how far its `created_at` is from true time."""
        job = self.client.enqueue("test.record", {"seconds": 0.01})
        self.acknowledged.append(job.id)
        return job.created_at.seconds + job.created_at.nanos / 1e9 - time.time()

    def jump(self, offset: int) -> float:
        """Move the server's wall clock to true time + `offset`; returns the
        monotonic time the server was first seen on it."""
        self.clock.set(offset)
        wait_until(
            lambda: abs(self.probe_offset() - offset) < 60,
            15,
            f"the server's wall clock to move to {offset:+d} s",
            interval=0.1,
        )
        seen = time.monotonic()
        self.jumps.append((offset, seen, time.time()))
        return seen

    def running(self) -> set[str]:
        return {job.id for job in self.client.list_all(statuses=[jobs_pb2.JOB_STATUS_RUNNING])}

    def lease_expiry(self, job_id: str) -> float | None:
        value = job_row(self.database_url, job_id)["lease_expires_at"]
        return None if value is None else int(value) / 1e6

    def wait_renewed_into_frame(self, job_id: str, offset: int, since: float) -> float:
        """Wait until the running job's lease expiry is stamped in the frame of
        `offset` (a heartbeat renewed it after the jump); returns the delay."""

        def renewed() -> bool:
            expiry = self.lease_expiry(job_id)
            return expiry is not None and abs(expiry - time.time() - offset) < 60

        wait_until(renewed, 2 * HEARTBEAT_SECONDS + SLACK, f"a heartbeat of {job_id} after the jump")
        return time.monotonic() - since

    def wait_renewed(self, job_id: str) -> None:
        """Wait for one heartbeat of a running job (its lease expiry moves)."""
        wait_until(lambda: self.lease_expiry(job_id) is not None, 30, f"{job_id} to run")
        first = self.lease_expiry(job_id)
        wait_until(
            lambda: self.lease_expiry(job_id) != first,
            2 * HEARTBEAT_SECONDS + SLACK,
            f"a heartbeat of {job_id}",
        )

    def wait_all_done(self) -> list[str]:
        """Wait (bounded) until every acknowledged job is terminal; returns the
        ones that are not."""

        def unfinished() -> list[str]:
            statuses = {job.id: job.status for job in self.client.list_all()}
            return [job_id for job_id in self.acknowledged if statuses.get(job_id) not in TERMINAL]

        deadline = time.monotonic() + ALL_DONE_BOUND
        while (left := unfinished()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def idle_wake_seconds(self) -> float:
        """Enqueue one job and time it to the end: with a 30 s poll, only the
        wake-up signal of the commit can make this quick."""
        began = time.monotonic()
        job_id = self.enqueue(0.01)
        self.client.wait_terminal(job_id, 30)
        return time.monotonic() - began

    def executions(self) -> list[dict[str, Any]]:
        return list(iter_records(self.records))

    def started_attempts(self) -> int:
        return int(
            database_reads.scalar(
                self.database_url, "SELECT count(*) FROM job_events WHERE type = 'job.started'"
            )
        )

    def wait_executions_ended(self) -> None:
        """Every attempt's execution has ended (its record line is written last)."""
        wait_until(lambda: len(self.executions()) >= self.started_attempts(), 30, "every execution to end")

    def available_at(self, job_id: str) -> float:
        value = database_reads.scalar(
            self.database_url, "SELECT available_at FROM jobs WHERE id = :job_id", job_id=job_id
        )
        return int(value) / 1e6


@contextlib.contextmanager
def faked_server(tmp_path: Path, url: str) -> Iterator[Run]:
    library = libfaketime()
    require(library is not None, "libfaketime (Debian package `faketime`)")
    assert library is not None
    clock = FakeWallClock(tmp_path)
    records = tmp_path / "records"
    records.mkdir()
    server = Leasehold.serve(url, *FLAGS, env={**clock.env(library), RECORD_DIR_ENV: str(records)})
    try:
        port = server.start()
        assert server.process is not None
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()
        assert "libfaketime" in maps, "libfaketime is not loaded into the server"
        with Client(port) as client:
            run = Run(server, client, clock, url, records)
            assert abs(run.probe_offset()) < 60
            yield run
    finally:
        server.kill()


@dataclass
class Findings:
    """What the database, the log and the record files say after a run."""

    histories: dict[str, list[Attempt]]
    logs: dict[str, list[LoggedEvent]]
    executions: dict[tuple[str, int], dict[str, Any]]
    lost: list[tuple[str, int]]  # attempts closed by job.lease_expired

    @property
    def stale_completions(self) -> list[tuple[str, int]]:
        """Attempts whose handler returned but whose lease was gone: the
        completion was offered and refused."""
        return [key for key in self.lost if self.executions[key]["outcome"] == "returned"]


def examine(run: Run) -> Findings:
    """Every invariant that must hold whatever the clock did."""
    rows = job_rows(run.database_url)
    assert set(rows) == set(run.acknowledged), "acknowledged jobs missing, or unknown jobs present"
    logs = event_logs(run.database_url)
    # Gap-free, one closing event per started attempt, at most one terminal
    # event (so never two job.succeeded), nothing after it.
    histories = {job_id: attempt_history(job_id, logs[job_id]) for job_id in rows}
    for job_id, history in histories.items():
        if rows[job_id]["status"] != "running":
            assert rows[job_id]["attempt"] == (history[-1].number if history else 0), (job_id, history)
    executions: dict[tuple[str, int], dict[str, Any]] = {}
    for record in run.executions():
        key = (record["job_id"], int(record["attempt"]))
        assert key not in executions, f"attempt {key} executed twice"
        executions[key] = record
    started = {
        (job_id, int(event.payload["attempt"]))
        for job_id, events in logs.items()
        for event in events
        if event.type == "job.started"
    }
    assert set(executions) == started, "executions and job.started events disagree"
    lost = [
        (job_id, a.number)
        for job_id, history in histories.items()
        for a in history
        if a.closed_by == "job.lease_expired"
    ]
    return Findings(histories, logs, executions, lost)


def unlogged_lost_leases(run: Run, findings: Findings) -> str | None:
    """DESIGN §3: a lost lease stops the handler's right to finish "and is
    logged", whether its completion or its heartbeat found out."""
    logged = {(r.get("job_id"), r.get("attempt")) for r in run.server.events("job.lease_lost")}
    unlogged = [key for key in findings.lost if key not in logged]
    if not unlogged:
        return None
    outcomes = Counter(findings.executions[key]["outcome"] for key in unlogged)
    return f"lost leases never logged as job.lease_lost: {unlogged} (handler outcomes {dict(outcomes)})"


def unfinished_jobs(run: Run, stuck: list[str]) -> str | None:
    if not stuck:
        return None
    server_now = time.time() + run.clock.offset
    rows = job_rows(run.database_url)
    described = [
        f"{job_id} {rows[job_id]['status']} (attempt {rows[job_id]['attempt']}, available"
        f" {run.available_at(job_id) - server_now:+.0f} s from the server's now)"
        for job_id in stuck
    ]
    return f"{len(stuck)} jobs did not finish within {ALL_DONE_BOUND:g} s: {described}"


def assert_none(*problems: str | None) -> None:
    """Report every problem found, not only the first."""
    found = [problem for problem in problems if problem]
    assert not found, "\n".join(found)


@pytest.mark.timeout(120)
def test_a_forward_jump_reruns_under_fencing_and_a_jump_back_loses_nothing(
    tmp_path: Path, database_url: str, figures: Figures
) -> None:
    """+1 h with every slot busy: the running attempts lose their leases (stale
    completions refused, a long handler stopped by its heartbeat) and run again
    as attempt 2; then back to true time while a job started an hour ahead runs
    on heartbeats and work stamped an hour ahead waits in the queue."""
    with faked_server(tmp_path, database_url) as run:
        # True time: a long job that will live on heartbeats, and enough short ones
        # to keep all four slots busy through the jump.
        lost_long = run.enqueue(LONG)
        for _ in range(16):
            run.enqueue(SHORT)
        wait_until(lambda: len(run.running()) == CONCURRENCY, 30, "all slots to be busy")
        forward_seen = run.jump(+HOUR)

        # One hour ahead: a long job to carry across the jump back, work behind it.
        carried = run.enqueue(LONG)
        for _ in range(8):
            run.enqueue(SHORT)
        run.wait_renewed(carried)
        back_seen = run.jump(0)
        renew_delay = run.wait_renewed_into_frame(carried, 0, back_seen)
        for _ in range(4):
            run.enqueue(SHORT)

        stuck = run.wait_all_done()
        idle_wake = run.idle_wake_seconds()
        run.wait_executions_ended()
        assert run.server.interrupt() < EXIT_SECONDS and run.server.returncode == 0, run.server.output[-3000:]

    findings = examine(run)
    forward_wall = run.jumps[0][2]
    figures("clock jumps", len(run.jumps))
    figures("jobs", len(run.acknowledged))
    figures("re-runs caused by the forward jump", len(findings.lost))
    figures("stale completions rejected", len(findings.stale_completions))
    figures("handlers stopped by their heartbeat", len(findings.lost) - len(findings.stale_completions))
    figures("heartbeat in new frame after -1h s", renew_delay)
    figures("idle wake on Enqueue s", idle_wake)
    figures("jobs stuck after the jump back", len(stuck))

    # The forward jump hit running work: it was taken back and re-run, and the
    # old attempts' completions were refused (no second job.succeeded, above).
    assert findings.lost, "the forward jump expired no running lease"
    assert findings.stale_completions, "no attempt offered a completion after losing its lease"
    for job_id, number in findings.lost:
        history = findings.histories[job_id]
        # Expired in the +1 h frame only: the jump back expired nothing.
        closed_at = next(a.closed_at for a in history if a.number == number)
        assert abs(closed_at - forward_wall - HOUR) < 120, (job_id, history)
        # The old attempt stopped soon after the jump: at its completion or at
        # its next heartbeat.
        execution = findings.executions[(job_id, number)]
        assert execution["end_monotonic"] < forward_seen + HEARTBEAT_SECONDS + SLACK, execution
    assert (lost_long, 1) in findings.lost
    assert findings.executions[(lost_long, 1)]["outcome"] == "interrupted"  # stopped by its heartbeat
    # Carried across the jump back on heartbeats alone: one attempt, never lost.
    assert [(a.number, a.closed_by) for a in findings.histories[carried]] == [(1, "job.succeeded")]
    assert renew_delay < 2 * HEARTBEAT_SECONDS + SLACK
    assert idle_wake < IDLE_WAKE_BOUND
    assert_none(unlogged_lost_leases(run, findings), unfinished_jobs(run, stuck))
    # ...and each in the end succeeded, once (attempt_history allows one terminal event).
    for job_id, history in findings.histories.items():
        assert history and history[-1].closed_by == "job.succeeded", (job_id, history)


@pytest.mark.timeout(120)
def test_a_jump_below_true_time_moves_no_timer_and_loses_no_lease(
    tmp_path: Path, database_url: str, figures: Figures
) -> None:
    """-1 h from true time while a long job lives on heartbeats, a job runs into
    its timeout and work waits in the queue: no lease lost, the timeout fires
    after its real duration, and the queued work runs."""
    with faked_server(tmp_path, database_url) as run:
        carried = run.enqueue(LONG + 1)
        timed_out = run.enqueue(60, timeout_seconds=TIMEOUT_SECONDS, max_attempts=1)
        for _ in range(8):
            run.enqueue(SHORT)
        run.wait_renewed(carried)
        assert timed_out in run.running()
        back_seen = run.jump(-HOUR)
        renew_delay = run.wait_renewed_into_frame(carried, -HOUR, back_seen)
        for _ in range(4):
            run.enqueue(SHORT)

        stuck = run.wait_all_done()
        idle_wake = run.idle_wake_seconds()
        timed_out_job = run.client.get(timed_out)
        run.wait_executions_ended()
        assert run.server.interrupt() < EXIT_SECONDS and run.server.returncode == 0, run.server.output[-3000:]

    findings = examine(run)
    timeout_execution = findings.executions[(timed_out, 1)]
    timeout_took = timeout_execution["end_monotonic"] - timeout_execution["start_monotonic"]
    figures("clock jumps", len(run.jumps))
    figures("jobs", len(run.acknowledged))
    figures("heartbeat in new frame after -1h s", renew_delay)
    figures(f"timeout {TIMEOUT_SECONDS} s fired after s", timeout_took)
    figures("idle wake on Enqueue s", idle_wake)
    figures("jobs stuck after the jump", len(stuck))

    # A backward jump makes leases look longer: no lease may be lost.
    assert not findings.lost, f"attempts lost their lease on a backward jump: {findings.lost}"
    assert [(a.number, a.closed_by) for a in findings.histories[carried]] == [(1, "job.succeeded")]
    assert renew_delay < 2 * HEARTBEAT_SECONDS + SLACK
    # The timeout spanned the jump and fired after its real duration.
    assert timeout_execution["start_monotonic"] < back_seen < timeout_execution["end_monotonic"]
    assert TIMEOUT_SECONDS - 0.1 < timeout_took < TIMEOUT_SECONDS + SLACK, timeout_execution
    assert timed_out_job.status == jobs_pb2.JOB_STATUS_FAILED
    assert timed_out_job.error_message == "Background job timed out."
    assert idle_wake < IDLE_WAKE_BOUND
    assert_none(unfinished_jobs(run, stuck))
    for job_id, history in findings.histories.items():
        if job_id != timed_out:
            assert [(a.number, a.closed_by) for a in history] == [(1, "job.succeeded")], (job_id, history)

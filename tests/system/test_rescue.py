"""Rescue with every slot busy (DESIGN §9, the rescuer), two processes on one SQLite file.

Promise (docs/jobs.md "Jobs", the state machine): expired leases are recovered by a rescuer
on every replica every `--rescue-seconds`, as well as by claims, so a process
whose slots are all busy still gets a stalled process's jobs back.

How: process A (`--concurrency 1`) runs a long `example.sleep` job in its only
slot, so its claimer never claims. Process B claims a second job and is frozen
with SIGSTOP (outside SQLite's write lock) before its first heartbeat, so its
lease lapses LEASE_SECONDS after B's `job.started`. Nothing claims after that:
A is full and B is frozen. A's rescuer alone must requeue B's job, within about
one rescue interval of the expiry, while A's slot is still busy.

Checked against a mutant (the rescuer's loop not calling recover): B's job stays
`running` and the wait for its `job.lease_expired` times out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import database_reads
from tests.reliability.test_concurrent_claimers import freeze_outside_write_lock, holds_write_lock
from tests.system.helpers import Client, Leasehold, job_row, run_cli, sqlite_path, wait_until

pytestmark = pytest.mark.slow

LEASE_SECONDS = 6.0
RESCUE_SECONDS = 1.0
# What a loaded two-core machine may add to one rescue interval (a late tick, a
# write queued behind others). Without a rescuer the job would stay running as
# long as the busy process's long job runs (a minute), so the bound still tells
# the two apart by far.
SLACK_SECONDS = 3.0
LONG_JOB = {"seconds": 60, "steps": 60}  # outlasts the test; a progress event a second
SERVE_FLAGS = ("--concurrency", "1", "--lease-seconds", f"{LEASE_SECONDS:g}")
RESCUE_FLAGS = ("--rescue-seconds", f"{RESCUE_SECONDS:g}")


def event_time(database_url: str, job_id: str, event_type: str) -> float | None:
    """When the job's first `event_type` event was committed (seconds since the
    epoch, on the committing process's clock), or None if it has none yet."""
    found = database_reads.rows(
        database_url,
        "SELECT created_at FROM job_events WHERE job_id = :job_id AND type = :type ORDER BY sequence LIMIT 1",
        job_id=job_id,
        type=event_type,
    )
    return int(found[0]["created_at"]) / 1_000_000 if found else None


def start_long_job(process: Leasehold) -> str:
    """Enqueue a long job through `process` and wait until it runs there."""
    with Client(process.port or 0) as client:
        job_id = client.enqueue("example.sleep", LONG_JOB).id
    wait_until(
        lambda: process.events_for("job.started", job_id),
        timeout=30,
        what=f"job {job_id} to start",
        interval=0.01,  # freeze soon after the claim: well before the first heartbeat
    )
    return job_id


def freeze(process: Leasehold, writing: Callable[[], bool]) -> None:
    """SIGSTOP the process at a moment it holds no write lock (`writing()`)."""
    assert process.process is not None
    freeze_outside_write_lock(process.process.pid, writing)


@dataclass(frozen=True)
class Rescue:
    """A frozen process's job, recovered by someone else: the times that tell how
    soon (seconds since the epoch)."""

    started_at: float  # its job.started (the claim)
    expires_at: float  # its lease, as the frozen process left it
    recovered_at: float  # its job.lease_expired

    @property
    def after_expiry(self) -> float:
        return self.recovered_at - self.expires_at

    @property
    def after_start(self) -> float:
        return self.recovered_at - self.started_at


def await_rescue(database_url: str, job_id: str) -> Rescue:
    """Read the frozen job's lease, then wait (polling the database) for its
    `job.lease_expired`; fails if none comes well past the bound the tests assert."""
    started_at = event_time(database_url, job_id, "job.started")
    row = job_row(database_url, job_id)
    assert started_at is not None and row["status"] == "running", row
    expires_at = int(row["lease_expires_at"]) / 1_000_000
    # Frozen before its first heartbeat (lease/3 after the claim): the lease ends
    # one lease after `job.started`, which the bound below is measured from.
    assert expires_at - started_at == pytest.approx(LEASE_SECONDS, abs=0.01), row
    recovered_at = wait_until(
        lambda: event_time(database_url, job_id, "job.lease_expired"),
        timeout=LEASE_SECONDS + RESCUE_SECONDS + SLACK_SECONDS + 10,
        what=f"job {job_id} to be rescued",
    )
    rescue = Rescue(started_at, expires_at, recovered_at)
    print(
        f"rescued {rescue.after_expiry:.3f}s after the lease expired ({rescue.after_start:.3f}s after start)"
    )
    return rescue


def assert_rescued_in_time(rescue: Rescue) -> None:
    assert rescue.after_expiry >= 0, f"recovered a live lease: {rescue}"
    assert rescue.after_start <= LEASE_SECONDS + RESCUE_SECONDS + SLACK_SECONDS, rescue


def worker_of(process: Leasehold) -> str:
    started = process.started.record
    return str(started["worker_id"])


def test_a_process_with_every_slot_busy_rescues_a_frozen_processs_job(
    database_url: str, processes: Callable[[Leasehold], Leasehold]
) -> None:
    migrated = run_cli("migrate", "--database-url", database_url)
    assert migrated.returncode == 0, migrated.stderr
    busy = processes(Leasehold.serve(database_url, *SERVE_FLAGS, *RESCUE_FLAGS))
    busy.start()
    long_id = start_long_job(busy)
    stalled = processes(Leasehold.serve(database_url, *SERVE_FLAGS))
    stalled.start()
    job_id = start_long_job(stalled)
    assert stalled.process is not None
    shm_path = Path(f"{sqlite_path(database_url)}-shm")
    freeze(stalled, functools.partial(holds_write_lock, stalled.process.pid, shm_path))

    rescue = await_rescue(database_url, job_id)

    assert_rescued_in_time(rescue)
    row = job_row(database_url, job_id)
    assert (row["status"], row["attempt"], row["lease_owner"]) == ("queued", 1, None), row
    # ...while the busy process's only slot is still taken: it never claimed, its
    # rescuer did the work (the frozen process could not have).
    long_row = job_row(database_url, long_id)
    assert (long_row["status"], long_row["lease_owner"]) == ("running", worker_of(busy)), long_row
    assert [r["job_id"] for r in busy.events("job.started")] == [long_id]
    wait_until(
        lambda: busy.events_for("job.lease_expired", job_id), timeout=5, what="the rescue's log record"
    )
    assert [r["level"] for r in busy.events_for("job.lease_expired", job_id)] == ["warning"]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("--lease-seconds", "6", "--rescue-seconds", "7"), {}, "rescue_seconds: must be between 0.05 and"),
        ((), {"LEASEHOLD_RESCUE_SECONDS": "0.01"}, "rescue_seconds: must be between 0.05 and"),
        ((), {"LEASEHOLD_RESCUE_SECONDS": "soon"}, "LEASEHOLD_RESCUE_SECONDS: expected a number"),
    ],
    ids=["longer-than-the-lease", "too-short", "not-a-number"],
)
def test_a_bad_rescue_interval_ends_serve_with_one_line_naming_it(
    database_url: str, args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    result = run_cli("serve", "--database-url", database_url, *args, env=env)

    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"leasehold: {message}") and result.stderr.count("\n") == 1, result.stderr

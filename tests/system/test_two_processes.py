"""Two `leasehold serve` processes on one SQLite file share the queue without
running any job twice."""

from __future__ import annotations

import collections
import os
import sqlite3
import time
from pathlib import Path

import pytest

from leasehold.v1 import jobs_pb2
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import (
    EXIT_SECONDS,
    TERMINAL,
    TEST_HANDLERS,
    Client,
    Leasehold,
    assert_gap_free,
    event_payload,
    iter_records,
    run_cli,
    sqlite_path,
    types,
    wait_until,
)

pytestmark = pytest.mark.slow

JOBS = 60


def test_two_processes_run_each_job_exactly_once(tmp_path: Path, database_url: str, processes) -> None:
    records_dir = tmp_path / "records"
    records_dir.mkdir()
    migrated = run_cli("migrate", "--database-url", database_url)
    assert migrated.returncode == 0, migrated.stderr

    # A short poll so that each process also notices work enqueued through the
    # other one (in-process wake-ups do not cross process boundaries).
    flags = ("--concurrency", "4", "--lease-seconds", "6", "--poll-seconds", "0.05")
    env = {RECORD_DIR_ENV: str(records_dir)}
    pair = [
        processes(Leasehold.serve(database_url, *flags, "--handlers", *TEST_HANDLERS, env=env))
        for _ in range(2)
    ]
    for process in pair:
        process.launch()  # both start (and open the file) at the same time
    clients = [Client(process.wait_started()) for process in pair]
    try:
        # Alternate between the two, so each has work announced in-process.
        ids = [clients[i % 2].enqueue("test.record", {"seconds": 0.05}).id for i in range(JOBS)]

        def all_finished() -> list[jobs_pb2.Job] | None:
            listed = clients[0].list_all(kind="test.record")
            if len(listed) == JOBS and all(job.status in TERMINAL for job in listed):
                return listed
            return None

        finished = wait_until(all_finished, timeout=60, what=f"all {JOBS} jobs to finish")
        logs = {job_id: clients[1].all_events(job_id, timeout=10) for job_id in ids}
    finally:
        for client in clients:
            client.close()
    for process in pair:
        assert process.interrupt() < EXIT_SECONDS
        assert process.returncode == 0

    assert sorted(job.id for job in finished) == sorted(ids)
    assert {job.status for job in finished} == {jobs_pb2.JOB_STATUS_SUCCEEDED}
    assert {job.attempt for job in finished} == {1}

    # Each job executed exactly once, by one of the two processes.
    records = list(iter_records(records_dir))
    by_job = collections.defaultdict(list)
    for record in records:
        by_job[record["job_id"]].append(record)
    assert sorted(by_job) == sorted(ids)
    assert {job_id: len(runs) for job_id, runs in by_job.items() if len(runs) != 1} == {}
    assert {(r["attempt"], r["outcome"]) for r in records} == {(1, "returned")}
    pids = {process.process.pid for process in pair if process.process is not None}
    assert {record["pid"] for record in records} <= pids
    # No job ever ran in two places at once (implied by "once", checked directly).
    for runs in by_job.values():
        runs.sort(key=lambda r: r["start_monotonic"])
        for before, after in zip(runs, runs[1:], strict=False):
            assert after["start_monotonic"] >= before["end_monotonic"], runs

    # Each log: queued, started (attempt 1), succeeded; no lease was lost or expired.
    for job_id, events in logs.items():
        assert_gap_free(events)
        assert types(events) == ["job.queued", "job.started", "job.succeeded"], job_id
        assert event_payload(events[1]) == {"attempt": 1}
    for process in pair:
        assert not process.events("job.lease_lost")
        assert not process.events("job.record_failed")
        assert not process.events("runtime.claim_failed")
    started = [r["job_id"] for process in pair for r in process.events("job.started")]
    assert sorted(started) == sorted(ids)

    # Both processes normally take a share; one taking everything is legal (the
    # other may simply have been slower to look), so it is reported, not asserted.
    share = collections.Counter(record["pid"] for record in records)
    print(f"jobs executed per process: {dict(share)}")


def _has_open(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.path.realpath(fd) == str(path) for fd in fds.iterdir())
    except OSError:  # the process is gone, or an fd closed while we looked
        return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see open files")
def test_two_servers_starting_together_on_a_fresh_file_both_come_up(database_url: str, processes) -> None:
    path = sqlite_path(database_url).resolve()
    # Hold SQLite's write lock while both processes open the file, so both look at
    # the (empty) schema before either can write: the race then happens every
    # time instead of now and then. A correct migrator takes the write lock before
    # it looks, waits here (busy timeout 5 s), and finds the schema done.
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        lock.execute("PRAGMA journal_mode=WAL")
        lock.execute("BEGIN IMMEDIATE")
        pair = [processes(Leasehold.serve(database_url)).launch() for _ in range(2)]
        # Hold the lock until both have the file open (a fixed migrator may wait
        # on a lock of its own before opening it: then give up after 3 s), plus a
        # moment for both to reach their first write. This only widens the race
        # window; it stays well inside SQLite's 5 s busy timeout.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not all(
            p.process is not None and _has_open(p.process.pid, path) for p in pair
        ):
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
    ports = [process.wait_started(timeout=20) for process in pair]
    assert all(ports)
    for process in pair:
        assert process.interrupt() < EXIT_SECONDS and process.returncode == 0

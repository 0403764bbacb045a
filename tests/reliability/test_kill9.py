"""Experiment 2 — kill -9 trials.

Promise (docs/guarantees.md "Durability", docs/jobs.md "Leases and delivery semantics"): a job or
event is acknowledged only after it is committed, so SIGKILL of the server loses nothing
that was acknowledged; work in flight is recovered through its lease by the next
process on the same database, running each interrupted job exactly one more time.

Both engines: on SQLite the crash can tear the file mid-write, so its integrity
is checked; on PostgreSQL the crash is a client's (the cluster stays up) and what
must hold is that the server never acknowledged before COMMIT returned and that
lease recovery works across the dead process's abandoned sessions.

How: ROUNDS rounds, each on its own database (two rounds run at a time, on
separate databases and processes). A `leasehold serve` (8 slots, 6 s lease, 50 ms
poll) gets BASE_JOBS `test.record` jobs of 0.05–0.3 s each, then a client thread
keeps enqueueing small jobs while the test waits a seeded random 0.2–1.5 s and
SIGKILLs the server mid-work. Straight after the kill (on PostgreSQL, once the
dead process's sessions have ended, so a COMMIT it had sent can no longer land)
the database is read directly (a SQLite file read-only, so the crash state is
left as it is): the engine's storage check must be ok (SQLite's `PRAGMA
integrity_check`; PostgreSQL's amcheck of every index), rows and logs must agree
(each row's last sequence is its gap-free log's length, a lease exactly on the
running rows), every acknowledged Enqueue must already be in it, no job the dead
process logged as completed may be found running, and the `running` rows are the
interrupted jobs. A second server is started on the same database; every job
must end succeeded, with List, Get and the database agreeing on the set of jobs
and their attempts. Interrupted jobs must show exactly `job.started {a}`,
`job.lease_expired {a}`, `job.started {a+1}`, `job.succeeded` (gap-free, the
same through WatchEvents as in the database), their new attempt must be claimed
only after the dead process's lease lapsed, and every other job must have run
exactly once (attempt 1). After the round the storage check must be ok again.

Recovery time, per round: from the moment the replacement process is launched
(just before `Popen`) to the moment the last interrupted job's next attempt began
executing its handler (its `start_monotonic` in the record file; the monotonic
clock is system-wide on Linux, so it compares with the test's own). It therefore
includes the replacement's start-up and the wait for the dead process's leases
to lapse (up to one lease, 6 s, after the kill), which dominates it, and the wait
of a requeued job behind the jobs already queued (a lapsed lease requeues its job
with `available_at = now`, so it goes to the back). The last two are also
reported on their own: `requeue_after_lease_lapse_max_s` (lapse to
`job.lease_expired`) and `claim_after_lease_lapse_max_s` (lapse to the next
`job.started`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2
from tests.reliability.conftest import Figures, NewDatabase
from tests.reliability.process_helpers import (
    attempt_history,
    consistency_problems,
    event_logs,
    job_rows,
    percentile,
    storage_check,
    wait_for_other_sessions_to_end,
)
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
    struct,
    wait_until,
)

# Per engine. Most of a round is the wait for the dead process's lease to lapse,
# the same on both; PostgreSQL runs fewer rounds so that the second engine adds
# well under a minute.
ROUNDS = {"sqlite": 10, "postgresql": 8}
PARALLEL_ROUNDS = 2
BASE_JOBS = 200
CONCURRENCY = 8
LEASE_SECONDS = 6.0
SEED = 20_240_917
FLAGS = (
    "--concurrency",
    str(CONCURRENCY),
    "--lease-seconds",
    "6",
    "--poll-seconds",
    "0.05",
    "--handlers",
    *TEST_HANDLERS,
)


class LateEnqueuer(threading.Thread):
    """Enqueues small jobs back to back (10 ms apart) until its server dies, keeping
    each acknowledged id with the monotonic time the acknowledgement arrived: the
    last of them was acknowledged moments before the SIGKILL."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.acked: list[tuple[str, float]] = []
        self.error: grpc.RpcError | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        with Client(self.port) as client:
            while not self._halt.is_set():
                try:
                    job = client.enqueue("test.record", {"seconds": 0.02})
                except grpc.RpcError as exc:
                    self.error = exc
                    return
                self.acked.append((job.id, time.monotonic()))
                self._halt.wait(0.01)

    def stop(self) -> None:
        self._halt.set()


def enqueue_pipelined(client: Client, sleeps: list[float]) -> list[str]:
    """Enqueue one `test.record` job per sleep with all calls in flight at once, so
    the server's group commit batches them (one fsync'd commit per call, one after
    another, takes ~20 ms each on this machine)."""
    calls = [
        client.stub.Enqueue.future(
            jobs_pb2.EnqueueRequest(kind="test.record", payload=struct({"seconds": seconds})),
            metadata=client.metadata,
            timeout=30,
        )
        for seconds in sleeps
    ]
    return [call.result().job.id for call in calls]


@dataclass(frozen=True)
class RoundResult:
    jobs: int
    interrupted: int
    late_acked: int
    recovery_seconds: float
    last_ack_before_kill_seconds: float
    lease_wait_seconds: float
    claim_after_lapse_seconds: float
    requeue_after_lapse_seconds: float
    abandoned_sessions: int


def run_round(directory: Path, url: str, rng: random.Random) -> RoundResult:
    """One crash and recovery on a fresh database; asserts everything about it."""
    records_dir = directory / "records"
    records_dir.mkdir(parents=True)
    env = {RECORD_DIR_ENV: str(records_dir)}

    # ----- phase 1: work, then SIGKILL at a random moment --------------------------------
    first = Leasehold.serve(url, *FLAGS, env=env)
    enqueuer: LateEnqueuer | None = None
    try:
        port = first.start()
        with Client(port) as client:
            base = enqueue_pipelined(client, [round(rng.uniform(0.05, 0.3), 3) for _ in range(BASE_JOBS)])
        enqueuer = LateEnqueuer(port)
        enqueuer.start()
        late = enqueuer
        wait_until(lambda: late.acked, timeout=10, what="the first enqueue of the kill window")
        time.sleep(rng.uniform(0.2, 1.5))  # the random moment of the crash
        kill_wall, kill_at = time.time(), time.monotonic()
    finally:
        first.kill()
        if enqueuer is not None:
            enqueuer.stop()
            enqueuer.join(15)
    assert first.returncode == -signal.SIGKILL
    assert enqueuer is not None and not enqueuer.is_alive()
    acked = [job_id for job_id, _ in enqueuer.acked]
    last_ack_gap = max(0.0, kill_at - enqueuer.acked[-1][1])

    # ----- phase 2: the database as the crash left it --------------------------------------
    abandoned_sessions = wait_for_other_sessions_to_end(url)
    assert storage_check(url) == "ok"
    crashed = job_rows(url)
    assert consistency_problems(crashed, event_logs(url)) == []
    missing = (set(base) | set(acked)) - set(crashed)
    assert not missing, f"acknowledged enqueues lost by kill -9: {sorted(missing)}"
    interrupted = {job_id: row for job_id, row in crashed.items() if row["status"] == "running"}
    # The experiment must catch jobs mid-run, and a process holds no more leases
    # than it has slots.
    assert 1 <= len(interrupted) <= CONCURRENCY, len(interrupted)
    assert all(row["lease_token"] and row["lease_expires_at"] for row in interrupted.values())
    completed_before_kill = {r["job_id"] for r in first.events("job.completed")}
    # job.completed is logged after the commit returned: such a job must not be
    # found running (an acknowledged completion that the crash undid).
    assert not completed_before_kill & set(interrupted)

    # ----- phase 3: restart on the same database; everything must finish ---------------------
    restart_at = time.monotonic()
    second = Leasehold.serve(url, *FLAGS, env=env)
    try:
        with Client(second.start()) as client:

            def settled() -> list[jobs_pb2.Job] | None:
                listed = client.list_all(kind="test.record")
                done = all(job.status in TERMINAL for job in listed)
                return listed if done and set(crashed) <= {job.id for job in listed} else None

            listed = wait_until(settled, timeout=45, what="every job to finish after the restart")
            got = {job.id: client.get(job.id) for job in listed}
            watched = {
                job_id: client.all_events(job_id, timeout=10) for job_id in [*interrupted, *acked[-3:]]
            }
        assert second.interrupt() < EXIT_SECONDS and second.returncode == 0
    finally:
        second.kill()

    # ----- phase 4: what the recovered database, the API and the logs say ---------------------
    assert storage_check(url) == "ok"
    final = job_rows(url)
    logs = event_logs(url)
    assert consistency_problems(final, logs) == []
    assert sorted(job.id for job in listed) == sorted(final), "List and the database disagree on the jobs"
    assert len(listed) == len(final) >= BASE_JOBS + len(acked)
    claim_delays: list[float] = []  # from a lease lapsing to the job's next claim
    requeue_delays: list[float] = []  # from a lease lapsing to its job.lease_expired
    for job in listed:
        assert job.status == jobs_pb2.JOB_STATUS_SUCCEEDED, job
        assert (got[job.id].status, got[job.id].attempt) == (job.status, job.attempt), "Get and List disagree"
        assert (final[job.id]["status"], final[job.id]["attempt"]) == ("succeeded", job.attempt)
        assert final[job.id]["last_event_sequence"] == len(logs[job.id])
        history = attempt_history(job.id, logs[job.id])
        closings = [(attempt.number, attempt.closed_by) for attempt in history]
        if job.id in interrupted:
            a = interrupted[job.id]["attempt"]
            assert closings == [(a, "job.lease_expired"), (a + 1, "job.succeeded")], (job.id, closings)
            # The next attempt was claimed only after the dead process's lease lapsed:
            # never two valid leases at once.
            lapsed_at = interrupted[job.id]["lease_expires_at"] / 1_000_000
            assert history[1].started_at >= lapsed_at
            claim_delays.append(history[1].started_at - lapsed_at)
            requeue_delays.append(history[0].closed_at - lapsed_at)
        else:
            assert closings == [(1, "job.succeeded")], (job.id, closings)
        assert job.attempt == history[-1].number
    for job_id, events in watched.items():  # the API serves the same logs as the database holds
        assert_gap_free(events)
        assert [(e.sequence, e.type) for e in events] == [(e.sequence, e.type) for e in logs[job_id]]
        for api_event, stored in zip(events, logs[job_id], strict=True):
            assert event_payload(api_event) == stored.payload
    assert {r["job_id"] for r in second.events("job.lease_expired")} == set(interrupted)

    # Executions, from the record files: no attempt ran twice; each job's final
    # attempt returned; each interrupted job ran once more, in the new process.
    records = list(iter_records(records_dir))
    pairs = collections.Counter((r["job_id"], r["attempt"]) for r in records)
    assert not [pair for pair, count in pairs.items() if count > 1]
    returned = {(r["job_id"], r["attempt"]): r for r in records if r["outcome"] == "returned"}
    assert all((job.id, job.attempt) in returned for job in listed)
    assert second.process is not None
    restarts = []
    for job_id, row in interrupted.items():
        rerun = returned[(job_id, row["attempt"] + 1)]
        assert rerun["pid"] == second.process.pid
        restarts.append(rerun["start_monotonic"])
    recovery = max(restarts) - restart_at
    lease_wait = max(row["lease_expires_at"] for row in interrupted.values()) / 1_000_000 - kill_wall
    assert 0 < recovery < LEASE_SECONDS + 30, recovery
    # The replacement requeues a lapsed lease at its next claim: at once when idle
    # (it wakes for the lapse), else when a slot frees (jobs here last <= 0.3 s).
    # Generous for a loaded machine. The claim itself may wait longer, behind the
    # jobs queued before it, so that delay is reported, not bounded.
    assert max(requeue_delays) < 10, requeue_delays
    return RoundResult(
        jobs=len(listed),
        interrupted=len(interrupted),
        late_acked=len(acked),
        recovery_seconds=recovery,
        last_ack_before_kill_seconds=last_ack_gap,
        lease_wait_seconds=lease_wait,
        claim_after_lapse_seconds=max(claim_delays),
        requeue_after_lapse_seconds=max(requeue_delays),
        abandoned_sessions=abandoned_sessions,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill9_loses_nothing_and_reruns_interrupted_jobs_once(
    tmp_path: Path, new_database: NewDatabase, figures: Figures
) -> None:
    """ROUNDS independent crashes, PARALLEL_ROUNDS at a time; each round asserts its
    own invariants (see the module docstring), and the figures summarise them."""
    rounds = ROUNDS[new_database.engine]
    directories = [tmp_path / f"round-{index}" for index in range(rounds)]
    urls = [new_database(directory) for directory in directories]  # made here, not in the threads
    # Two rounds at a time: most of a round is spent waiting out the dead process's
    # lease, and each round has its own database, processes and seed.
    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL_ROUNDS) as pool:
        futures = [
            pool.submit(run_round, directory, url, random.Random(SEED + index))
            for index, (directory, url) in enumerate(zip(directories, urls, strict=True))
        ]
        results = [future.result() for future in futures]
    recoveries = [result.recovery_seconds for result in results]
    figures("rounds", len(results))
    figures("jobs", sum(result.jobs for result in results))
    figures("interrupted_total", sum(result.interrupted for result in results))
    figures("enqueued_in_kill_window", sum(result.late_acked for result in results))
    ack_gaps = [result.last_ack_before_kill_seconds for result in results]
    figures("last_ack_before_kill_p50_s", percentile(ack_gaps, 0.5))
    figures("last_ack_before_kill_max_s", max(ack_gaps))
    figures("lease_wait_max_s", max(result.lease_wait_seconds for result in results))
    figures("requeue_after_lease_lapse_max_s", max(r.requeue_after_lapse_seconds for r in results))
    figures("claim_after_lease_lapse_max_s", max(r.claim_after_lapse_seconds for r in results))
    figures("recovery_p50_s", percentile(recoveries, 0.5))
    figures("recovery_max_s", max(recoveries))
    if new_database.engine == "postgresql":
        figures("sessions_left_by_the_dead_max", max(r.abandoned_sessions for r in results))

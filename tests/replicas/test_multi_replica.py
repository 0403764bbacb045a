"""Several `leasehold serve` replicas on one PostgreSQL database.

The repository contract suite and the gRPC end-to-end suite prove the engine in
one process. These tests prove what only several processes can show: replicas
share one queue without ever running a job in two places at once (SKIP LOCKED
claims, fenced writes), a replica killed mid-job loses its jobs to the others
only once its leases lapse, and LISTEN/NOTIFY carries work and events across
processes (a job's events appended on one replica reach a WatchEvents stream
served by another, live).

Every check reads the event logs straight from the database and parses each
with `attempt_history`, which fails on two overlapping attempts, a gap, a
duplicate or a second terminal event.
"""

from __future__ import annotations

import collections
import itertools
import time

import grpc
import pytest

from leasehold.v1 import jobs_pb2
from tests.conftest import Postgres
from tests.reliability.process_helpers import attempt_history, event_logs, job_rows
from tests.replicas.support import (
    Track,
    enqueue_spread,
    sleep_request,
    start_replicas,
    started_attempts,
    status_counts,
    stop_all,
    worker_id,
)
from tests.system.helpers import Client, Leasehold, event_payload, wait_until

pytestmark = pytest.mark.slow

# Log records that mean something went wrong in a run that should be healthy.
TROUBLE_LOGS = frozenset(
    {
        "job.lease_lost",
        "job.lease_expired",
        "job.record_failed",
        "job.heartbeat_failed",
        "job.write_retrying",
        "runtime.claim_failed",
        "runtime.attempt_crashed",
        "storage.listen_failed",
        "storage.unreachable",
        "storage.write_failed",
        "job.lease_unrenewed",
        "api.internal_error",
    }
)
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def trouble(replica: Leasehold) -> list[dict[str, object]]:
    """The replica's log records that a healthy run never writes, and any error."""
    return [
        record
        for record in list(replica.records)
        if record.get("event") in TROUBLE_LOGS or record.get("level") in ("error", "critical")
    ]


# ----- 1. three replicas drain one queue ------------------------------------------------

DRAIN_JOBS = 2_000
DRAIN_FLAGS = ("--concurrency", "8", "--lease-seconds", "6", "--poll-seconds", "1")


@pytest.mark.timeout(240)
def test_three_replicas_drain_one_queue_running_each_job_once(postgres: Postgres, processes: Track) -> None:
    url = postgres.fresh_database_url()
    replicas = start_replicas(processes, url, 3, *DRAIN_FLAGS)
    clients = [Client(replica.port or 0) for replica in replicas]
    try:
        began = time.monotonic()
        ids = enqueue_spread(clients, (sleep_request(0.02) for _ in range(DRAIN_JOBS)))
        enqueued = time.monotonic()

        def drained() -> dict[str, int] | None:
            counts = status_counts(url)
            return counts if sum(counts.values()) == DRAIN_JOBS and set(counts) <= TERMINAL_STATUSES else None

        counts = wait_until(drained, timeout=150, what=f"all {DRAIN_JOBS} jobs to finish", interval=0.5)
        finished = time.monotonic()
    finally:
        for client in clients:
            client.close()
    stop_all(replicas)
    print(f"enqueue {enqueued - began:.1f}s, drain {finished - began:.1f}s")

    assert len(set(ids)) == DRAIN_JOBS
    assert counts == {"succeeded": DRAIN_JOBS}
    rows = job_rows(url)
    assert set(rows) == set(ids)
    assert {row["attempt"] for row in rows.values()} == {1}
    assert {(row["lease_owner"], row["lease_token"]) for row in rows.values()} == {(None, None)}

    # The logs: one attempt each, started once and closed by its success; no lease
    # expired or was handed back, so no job ever ran in two places at once.
    logs = event_logs(url)
    assert set(logs) == set(ids)
    for job_id, events in logs.items():
        history = attempt_history(job_id, events)
        assert [(a.number, a.closed_by) for a in history] == [(1, "job.succeeded")], job_id
        assert [e.type for e in events] == ["job.queued", "job.started", "progress", "job.succeeded"], job_id

    # Each attempt was claimed by exactly one replica, and every replica took a share.
    claims = collections.Counter(itertools.chain.from_iterable(started_attempts(r) for r in replicas))
    assert set(claims) == {(job_id, 1) for job_id in ids}
    assert {claim: n for claim, n in claims.items() if n != 1} == {}
    shares = [len(started_attempts(replica)) for replica in replicas]
    print(f"jobs run per replica: {shares}")
    assert all(share > 0 for share in shares), shares
    assert len({worker_id(replica) for replica in replicas}) == 3
    for replica in replicas:
        assert trouble(replica) == []


# ----- 2. a replica killed while it holds jobs ------------------------------------------

KILL_LEASE_SECONDS = 6
KILL_FLAGS = ("--concurrency", "4", "--lease-seconds", str(KILL_LEASE_SECONDS), "--poll-seconds", "0.5")
KILL_JOBS = 24
KILL_JOB_SECONDS = 3.0


@pytest.mark.timeout(180)
def test_jobs_of_a_killed_replica_run_again_on_the_survivors_after_their_leases_lapse(
    postgres: Postgres, processes: Track
) -> None:
    url = postgres.fresh_database_url()
    replicas = start_replicas(processes, url, 3, *KILL_FLAGS)
    victim, survivors = replicas[0], replicas[1:]
    clients = [Client(replica.port or 0) for replica in replicas]
    try:
        # 24 jobs of 3 s in 3 steps for 12 slots: every replica is busy at once,
        # and there is queued work left over when the victim dies.
        requests = (sleep_request(KILL_JOB_SECONDS, 3, max_attempts=5) for _ in range(KILL_JOBS))
        ids = enqueue_spread(clients, requests)
        wait_until(lambda: started_attempts(victim), timeout=60, what="the victim to start a job")
        victim.kill()
        killed_at = time.time()
        # What it held when it died, as the database says (its log may lack a
        # claim it committed just before the kill): nobody can take these jobs
        # before their leases lapse, at least 6 s after a claim made moments ago.
        victim_id = worker_id(victim)
        held_at_death = {
            (job_id, row["attempt"])
            for job_id, row in job_rows(url).items()
            if row["status"] == "running" and row["lease_owner"] == victim_id
        }

        def drained() -> dict[str, int] | None:
            counts = status_counts(url)
            return counts if set(counts) <= TERMINAL_STATUSES else None

        counts = wait_until(drained, timeout=120, what="the survivors to finish every job", interval=0.25)
    finally:
        for client in clients:
            client.close()
    stop_all(survivors)

    # Nothing lost: every acknowledged job is there and succeeded.
    assert counts == {"succeeded": KILL_JOBS}
    assert set(job_rows(url)) == set(ids)

    logs = event_logs(url)
    assert set(logs) == set(ids)
    histories = {job_id: attempt_history(job_id, events) for job_id, events in logs.items()}

    # Exactly the attempts the victim held when it died were closed by
    # job.lease_expired: none of the survivors' (they were healthy), and at least
    # one (or the test proved nothing).
    expired = {
        (job_id, attempt.number): attempt
        for job_id, history in histories.items()
        for attempt in history
        if attempt.closed_by == "job.lease_expired"
    }
    assert held_at_death, "the victim held no job when it was killed"
    assert set(expired) == held_at_death
    for (job_id, number), attempt in expired.items():
        closing = next(e for e in logs[job_id] if e.type == "job.lease_expired")
        # Not taken before the lease could have lapsed: it was at least one lease
        # long (heartbeats only extend it), and the kill came after the start.
        assert attempt.closed_at - attempt.started_at >= KILL_LEASE_SECONDS, (job_id, attempt)
        assert attempt.closed_at >= killed_at, (job_id, attempt, killed_at)
        assert closing.payload == {"attempt": number}
        # The next attempt ran on a survivor, to success.
        follow_up = histories[job_id][number]
        assert (follow_up.number, follow_up.closed_by) == (number + 1, "job.succeeded"), job_id
        runners = [r for r in survivors if (job_id, number + 1) in started_attempts(r)]
        assert len(runners) == 1, (job_id, number + 1)
        # Some survivor's claim found the lapsed lease and logged it.
        assert any(r.events_for("job.lease_expired", job_id) for r in survivors), job_id

    # No (job, attempt) was started by two replicas, none that the log lacks, and
    # every attempt in the log was logged by its replica, except perhaps one the
    # victim claimed just before the kill took it mid-sentence.
    claims = collections.Counter(itertools.chain.from_iterable(started_attempts(r) for r in replicas))
    assert {claim: n for claim, n in claims.items() if n != 1} == {}
    every_attempt = {(job_id, a.number) for job_id, history in histories.items() for a in history}
    assert set(claims) <= every_attempt
    assert every_attempt - set(claims) <= held_at_death
    print(f"victim held {len(held_at_death)} jobs at death, logged {len(started_attempts(victim))} starts")
    for job_id, history in histories.items():
        assert history[-1].closed_by == "job.succeeded", job_id
        assert len(history) == (2 if any(key[0] == job_id for key in expired) else 1), job_id
    for survivor in survivors:
        assert survivor.events("job.started"), "a survivor ran nothing"
        assert [r for r in trouble(survivor) if r.get("event") != "job.lease_expired"] == []


# ----- 3. a watch on one replica follows a job running on another ----------------------

WATCH_STEPS = 8
WATCH_SECONDS = 8.0


@pytest.mark.timeout(120)
def test_watch_on_one_replica_follows_live_events_appended_on_another(
    postgres: Postgres, processes: Track
) -> None:
    url = postgres.fresh_database_url()
    # B alone, so the job can only run there; A starts once it is running. On
    # PostgreSQL a watch hears of another replica's appends only through LISTEN
    # (there is no polling fallback), so nothing but B's notifications can move
    # A's stream past its first read. A's long poll just keeps its claimer quiet.
    (runner,) = start_replicas(processes, url, 1, "--concurrency", "1", "--poll-seconds", "1")
    with Client(runner.port or 0) as on_runner:
        job = on_runner.enqueue("example.sleep", {"seconds": WATCH_SECONDS, "steps": WATCH_STEPS})
        wait_until(lambda: runner.events_for("job.started", job.id), timeout=30, what="the job to start on B")
        (watcher,) = start_replicas(processes, url, 1, "--concurrency", "1", "--poll-seconds", "60")
        with Client(watcher.port or 0) as on_watcher:
            call = on_watcher.watch(job.id, after_sequence=0, timeout=90)
            received: list[jobs_pb2.JobEvent] = []
            live: list[int] = []  # sequences that arrived while the job was still running
            at_open = 0  # the last sequence in the database when the stream had opened
            try:
                for response in call:
                    received.append(response.event)
                    if not at_open:
                        at_open = job_rows(url)[job.id]["last_event_sequence"]
                    if on_runner.get(job.id).status == jobs_pb2.JOB_STATUS_RUNNING:
                        live.append(response.event.sequence)
            except grpc.RpcError as exc:
                raise AssertionError(f"watch on A broke: {exc.code()} after {len(received)} events") from exc
    stop_all([runner, watcher])

    # The whole log, in order, once each: queued, started, every step, succeeded.
    assert [e.sequence for e in received] == list(range(1, WATCH_STEPS + 4))
    assert [e.type for e in received] == ["job.queued", "job.started"] + ["progress"] * WATCH_STEPS + [
        "job.succeeded"
    ]
    assert [event_payload(e) for e in received[2:-1]] == [
        {"step": float(step), "steps": float(WATCH_STEPS)} for step in range(1, WATCH_STEPS + 1)
    ]
    assert {e.job_id for e in received} == {job.id}
    # Live, not a replay after the end: progress events that B appended after A's
    # stream had opened reached it while B was still running the job.
    assert at_open < WATCH_STEPS, f"A opened its watch too late to see live events (at {at_open})"
    live_progress = [s for s in live if s > at_open and received[s - 1].type == "progress"]
    print(f"opened at sequence {at_open}; live progress sequences {live_progress}")
    assert len(live_progress) >= 2, f"live sequences {live}, opened at {at_open}"
    # The handler ran on B only; A never claimed anything.
    assert [r["attempt"] for r in runner.events_for("job.started", job.id)] == [1]
    assert watcher.events("job.started") == []
    logs = event_logs(url)
    history = attempt_history(job.id, logs[job.id])
    assert [(a.number, a.closed_by) for a in history] == [(1, "job.succeeded")]
    assert [(e.sequence, e.type) for e in logs[job.id]] == [(e.sequence, e.type) for e in received]
    for replica in (runner, watcher):
        assert trouble(replica) == []

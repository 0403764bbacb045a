"""The primary of a pg_auto_failover pair dies under load, five times over.

Two `leasehold serve` replicas point at both nodes through one multi-host URL
(`tests.auto_failover.AutoFailoverPair`). The pair runs the documented setting:
synchronous replication, `synchronous_commit = on`. Clients enqueue and read on
both replicas all along, for the replicas' own handlers and for two
`leasehold worker` processes (one on each replica); a watch on each replica and
a subscriber to the owner's feed stay open across every switch. In each round,
once the standby is synchronous again, the primary's whole node is SIGKILLed
at a random moment and the monitor promotes the standby; then the dead node
rejoins as the new primary's standby.

What must hold, checked from the database and every client's record at the end:
- every acknowledged Enqueue is there, and every job ran to success;
- each job's log runs 1..N, and no attempt overlapped another of the same job;
- calls during a switch got OK or UNAVAILABLE, never another code;
- no two executions of one job's handler in the workers overlapped in time
  (each writes its start and end, on the machine's monotonic clock);
- watchers that resume after UNAVAILABLE from the last sequence they saw,
  and a subscriber that resumes from the last position it saw, as clients do,
  saw every event exactly once (the watchers in order);
- health reads SERVING on both replicas after each switch.

Each round's switch time (the kill to the first Enqueue both replicas answer)
and the UNAVAILABLE count are printed for the record.

The same load against the pair replicating asynchronously (the standby out of
the quorum: commits do not wait for it) shows what that setting costs: the
acknowledged jobs a failover lost are counted and printed, not asserted away,
and what is left must still be consistent (gap-free logs, no overlapping
attempt, every job run to its end).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2
from tests.auto_failover import AutoFailoverPair, find_pg_autoctl
from tests.postgres_cluster import find_bin_dir
from tests.reliability.process_helpers import attempt_history, consistency_problems, event_logs, job_rows
from tests.remote.support import TOKEN, worker
from tests.replicas.support import (
    Track,
    enqueue_spread,
    executions,
    serving,
    sleep_request,
    start_replicas,
    status_counts,
    stop_all,
    wait_drained,
)
from tests.replicas.test_database_restart import Load, listening_sessions
from tests.support import require
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import Client, run_cli, struct, wait_until

pytestmark = pytest.mark.slow

ROUNDS = 5
LEASE_SECONDS = 6
FLAGS = ("--concurrency", "4", "--lease-seconds", str(LEASE_SECONDS), "--poll-seconds", "0.5")
MAX_ATTEMPTS = 10
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def pair() -> AutoFailoverPair:
    bin_dir = find_bin_dir()
    require(bin_dir is not None, "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    require(find_pg_autoctl() is not None, "pg_autoctl (Debian's postgresql-15-auto-failover) not found")
    assert bin_dir is not None
    started = AutoFailoverPair(bin_dir)
    try:
        started.start()
    except BaseException:
        started.destroy()
        raise
    yield started  # type: ignore[misc]
    started.destroy()


@dataclass
class ResumingWatch:
    """A watcher as a client writes one: when its stream ends UNAVAILABLE (the
    replica lost the database), it opens it again after the last sequence it
    saw. It stops at the job's end."""

    client: Client
    job_id: str
    events: list[jobs_pb2.JobEvent] = field(default_factory=list)
    resumed: int = 0
    error: grpc.RpcError | None = None
    thread: threading.Thread | None = None

    def start(self) -> ResumingWatch:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while True:
            after = self.events[-1].sequence if self.events else 0
            try:
                for response in self.client.watch(self.job_id, after_sequence=after, timeout=300):
                    self.events.append(response.event)
                return  # the stream ends after the job's last event
            except grpc.RpcError as exc:
                if exc.code() != UNAVAILABLE:
                    self.error = exc
                    return
                self.resumed += 1
                time.sleep(0.2)  # a client's backoff before it asks again

    def finish(self) -> None:
        assert self.thread is not None
        self.thread.join(120)
        assert not self.thread.is_alive(), "the watch did not end with its job"
        assert self.error is None, self.error


@dataclass
class ResumingSubscriber:
    """A subscriber to the owner's feed as a client writes one: on UNAVAILABLE
    it subscribes again after the last position it saw."""

    client: Client
    received: list[tuple[str, int]] = field(default_factory=list)  # (job id, sequence)
    resumed: int = 0
    error: grpc.RpcError | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    call: object = None
    thread: threading.Thread | None = None

    def start(self) -> ResumingSubscriber:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        position = ""
        while not self.stop.is_set():
            request = jobs_pb2.SubscribeRequest(after_position=position)
            self.call = self.client.stub.Subscribe(request, metadata=self.client.metadata)
            try:
                for response in self.call:  # type: ignore[attr-defined]
                    self.received.append((response.event.job_id, response.event.sequence))
                    position = response.position
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.CANCELLED and self.stop.is_set():
                    return
                if exc.code() != UNAVAILABLE:
                    self.error = exc
                    return
                self.resumed += 1
                time.sleep(0.2)  # a client's backoff before it asks again

    def finish(self, expected: int) -> None:
        """Once it has received `expected` events, or a bounded wait is over."""
        wait_until(lambda: len(self.received) >= expected, timeout=60, what="the subscriber to catch up")
        self.stop.set()
        self.call.cancel()  # type: ignore[attr-defined]
        assert self.thread is not None
        self.thread.join(30)
        assert self.error is None, self.error


def _enqueued(client: Client) -> str | None:
    """An Enqueue answered now, or None if this replica answers UNAVAILABLE."""
    try:
        return client.enqueue("example.sleep", {"seconds": 0.1}, max_attempts=MAX_ATTEMPTS).id
    except grpc.RpcError as exc:
        assert exc.code() == UNAVAILABLE, exc
        return None


@pytest.mark.timeout(600)
@pytest.mark.parametrize("replication", ["synchronous", "asynchronous"])
def test_acknowledged_work_survives_five_failovers_under_load(
    pair: AutoFailoverPair, processes: Track, replication: str, tmp_path: Path
) -> None:
    synchronous = replication == "synchronous"
    if not synchronous:
        pair.replicate_asynchronously()
    url = pair.url()
    migrated = run_cli("migrate", "--database-url", url)
    assert migrated.returncode == 0, migrated.stderr
    records = tmp_path / "records"
    records.mkdir()
    replicas = start_replicas(
        processes,
        url,
        2,
        *FLAGS,
        *("--remote-kinds", "remote.*"),
        env={"LEASEHOLD_WORKER_TOKEN": TOKEN, RECORD_DIR_ENV: str(records)},
    )
    workers = [worker(processes, replica.port or 0, records) for replica in replicas]
    clients = [Client(replica.port or 0) for replica in replicas]
    loads: list[Load] = []
    rounds: list[dict[str, object]] = []
    rng = random.Random()
    try:
        # Jobs of 2 s in 4 steps keep handlers mid-job (appending, heartbeating).
        acked = enqueue_spread(clients, (sleep_request(2.0, 4, max_attempts=MAX_ATTEMPTS) for _ in range(16)))
        remote = jobs_pb2.EnqueueRequest(
            kind="remote.record", payload=struct({"seconds": 0.3}), max_attempts=MAX_ATTEMPTS
        )
        loads = [
            Load(client, acked[0], request=request).start()
            for client in clients
            for request in (None, remote)
        ]
        subscriber = ResumingSubscriber(clients[0]).start()
        # A long job watched from both replicas across every switch.
        watched = clients[0].enqueue("example.sleep", {"seconds": 40, "steps": 40}, max_attempts=MAX_ATTEMPTS)
        acked.append(watched.id)
        watches = [ResumingWatch(client, watched.id).start() for client in clients]

        for round_number in range(1, ROUNDS + 1):
            wait_until(
                lambda: status_counts(url).get("running", 0) >= 2, timeout=60, what="jobs to be running"
            )
            time.sleep(
                rng.uniform(0.2, 1.5)
            )  # a random moment in the load: the scenario, not a wait for a result
            assert pair.synchronous() == synchronous  # the setting under test, in force as the primary dies
            before = sum(len(load.acked) for load in loads)
            dead = pair.primary()
            pair.kill(dead)
            killed_at = time.monotonic()
            for client in clients:
                acked.append(
                    wait_until(lambda c=client: _enqueued(c), timeout=60, what="calls to succeed again")
                )
            switched = time.monotonic() - killed_at
            for client in clients:
                wait_until(lambda c=client: serving(c), timeout=30, what="health to read SERVING")
            # Each replica LISTENs again, on the new primary: work and events cross replicas.
            wait_until(
                lambda: listening_sessions(url) == len(replicas), timeout=30, what="both to LISTEN again"
            )
            pair.rejoin(dead)
            rounds.append(
                {
                    "round": round_number,
                    "switch_s": round(switched, 2),
                    "acked_by_load": sum(len(load.acked) for load in loads) - before,
                }
            )

        for load in loads:
            load.finish()
            acked.extend(load.acked)

        counts = wait_drained(url, timeout=180)
        for resuming in watches:
            resuming.finish()
        all_events = sum(len(events) for events in event_logs(url).values())
        subscriber.finish(all_events)
        assert [process.returncode for process in (*replicas, *workers)] == [None] * 4
    finally:
        for load in loads:
            load.stop.set()
        for client in clients:
            client.close()
    stop_all([*workers, *replicas])

    codes = Counter(code.name for load in loads for code in load.codes)
    rows = job_rows(url)
    # What each replica's log says of the switches: one line each way per outage.
    outages = [
        [record["down_seconds"] for record in replica.events("storage.reachable")] for replica in replicas
    ]
    lost = set(acked) - set(rows)
    logs = event_logs(url)
    expected = [(e.sequence, e.type) for e in logs[watched.id]]
    watch_mismatches = sum([(e.sequence, e.type) for e in w.events] != expected for w in watches)
    logged = sorted((job_id, e.sequence) for job_id, events in logs.items() for e in events)
    feed_mismatch = sorted(subscriber.received) != logged
    runs = executions(records)
    print(
        f"{replication}: rounds {rounds}; calls {dict(codes)}; acknowledged {len(set(acked))}; "
        f"found {len(rows)}; lost {len(lost)}; {counts}; watches resumed {[w.resumed for w in watches]}, "
        f"mismatched {watch_mismatches}; feed {len(subscriber.received)} events, resumed "
        f"{subscriber.resumed}, mismatched {feed_mismatch}; remote executions {sum(map(len, runs.values()))} "
        f"of {len(runs)} jobs; down_seconds per replica {outages}"
    )
    for replica in replicas:
        assert len(replica.events("storage.unreachable")) == len(replica.events("storage.reachable"))
        # The listener too: one line when it lost its connection, one when it is back, per switch.
        assert (
            len(replica.events("storage.listen_failed"))
            == len(replica.events("storage.listen_restored"))
            == ROUNDS
        )
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    assert len(set(acked)) == len(acked)
    if synchronous:
        assert not lost, sorted(lost)
        assert watch_mismatches == 0
        assert not feed_mismatch
    assert runs, "the workers ran no job"
    for job_id, ran in runs.items():
        for before, after in zip(ran, ran[1:], strict=False):
            assert after["start_monotonic"] >= before["end_monotonic"], (job_id, ran)
    assert counts == {"succeeded": len(rows)}
    assert consistency_problems(rows, logs) == []
    for job_id, events in logs.items():
        history = attempt_history(job_id, events)
        assert history[-1].closed_by == "job.succeeded", (job_id, history)

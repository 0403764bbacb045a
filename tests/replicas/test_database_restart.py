"""PostgreSQL stops and starts again under two serving replicas.

What must hold: while the database is down, calls in flight and calls made
then fail with UNAVAILABLE (the documented code; never INTERNAL, UNKNOWN or a
hang until the deadline), and the replicas stay up; once it is back, calls
succeed again without restarting anything, every job whose Enqueue was
acknowledged is still there and runs to success (workers recover their lapsed
leases), and each replica's LISTEN connection is re-established, so work and
events cross between replicas again.

The cluster is this test's own: stopping the session's cluster would break
every other test using it. It runs `durable=True` (fsync and synchronous
commit on): the session cluster's `synchronous_commit = off` acknowledges a
commit before its WAL leaves PostgreSQL's shared memory, so an `immediate`
stop (a crash) could lose acknowledged jobs through the test's configuration
rather than through Leasehold.
"""

from __future__ import annotations

import functools
import operator
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from leasehold._server.jobs.sql.postgres import CHANNEL
from leasehold.v1 import jobs_pb2
from tests.database_reads import scalar
from tests.postgres_cluster import PostgresCluster
from tests.reliability.process_helpers import attempt_history, event_logs, job_rows
from tests.replicas.support import (
    Track,
    enqueue_spread,
    own_cluster,
    rpc_code,
    sleep_request,
    start_replicas,
    status_counts,
    stop_all,
    wait_drained,
)
from tests.system.helpers import TERMINAL, Client, run_cli, wait_until

pytestmark = pytest.mark.slow

LEASE_SECONDS = 6
FLAGS = ("--concurrency", "4", "--lease-seconds", str(LEASE_SECONDS), "--poll-seconds", "0.5")
# Lost leases and failed writes during the outage cost attempts; plenty are left
# so "every job succeeds" tests recovery, not the attempt budget.
MAX_ATTEMPTS = 10
FIRST_JOBS = 16
BURST = 200
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def cluster() -> Iterator[PostgresCluster]:
    with own_cluster(durable=True, max_connections=100) as own:
        yield own


@dataclass
class Load:
    """Enqueue and Get calls on one replica, one after another, until stopped:
    whatever the database is doing, there is always a call in flight."""

    client: Client
    known_job_id: str
    # What each Enqueue sends: a short `example.sleep` unless given.
    request: jobs_pb2.EnqueueRequest | None = None
    acked: list[str] = field(default_factory=list)
    codes: list[grpc.StatusCode] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Load:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        request = self.request or sleep_request(0.2, 1, max_attempts=MAX_ATTEMPTS)
        while not self.stop.is_set():
            try:
                response = self.client.stub.Enqueue(request, metadata=self.client.metadata, timeout=15)
                self.acked.append(response.job.id)
            except grpc.RpcError as exc:
                self.codes.append(exc.code())
            self.codes.append(rpc_code(self.client.get, self.known_job_id))
            self.stop.wait(0.05)  # pacing only: a few calls per second, not a flood

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(30)
        assert not self.thread.is_alive(), "a call hung past its deadline"


def listening_sessions(database_url: str) -> int:
    """Sessions on the database whose last statement was the change feed's LISTEN."""
    return int(
        scalar(
            database_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = :listen",
            listen=f"LISTEN {CHANNEL}",
        )
    )


# A `fast` stop (sessions told, clean shutdown) back at once, and an `immediate`
# one (a crash; recovery at the next start) held down past a lease, so the
# leases of the jobs running when it went have lapsed by the time it returns.
OUTAGES = [("fast", 0.0), ("immediate", LEASE_SECONDS + 3.0)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("mode", "outage_seconds"), OUTAGES, ids=["fast-brief", "immediate-past-lease"])
def test_replicas_ride_out_a_database_restart(
    cluster: PostgresCluster, processes: Track, mode: str, outage_seconds: float
) -> None:
    url = cluster.url(cluster.create_database(prefix="restart"))
    migrated = run_cli("migrate", "--database-url", url)
    assert migrated.returncode == 0, migrated.stderr
    replicas = start_replicas(processes, url, 2, *FLAGS)
    clients = [Client(replica.port or 0) for replica in replicas]
    loads: list[Load] = []
    try:
        # Jobs of 2 s in 4 steps, so handlers are mid-job (appending events,
        # heartbeating) when the database goes away.
        requests = (sleep_request(2.0, 4, max_attempts=MAX_ATTEMPTS) for _ in range(FIRST_JOBS))
        acked = enqueue_spread(clients, requests)
        wait_until(lambda: status_counts(url).get("running", 0) >= 4, timeout=30, what="jobs to be running")
        wait_until(
            lambda: listening_sessions(url) == len(replicas),
            timeout=30,
            what="both replicas to LISTEN",
        )
        loads = [Load(client, acked[0]).start() for client in clients]
        # A watch in flight across the outage: it must either finish the whole log
        # or end UNAVAILABLE, never INTERNAL or a silent gap.
        watched = acked[-1]
        watch = clients[0].watch(watched, timeout=120)
        # A burst of Enqueues in flight at the moment the database stops.
        burst = [
            client.stub.Enqueue.future(
                sleep_request(0.2, 1, max_attempts=MAX_ATTEMPTS), metadata=client.metadata, timeout=30
            )
            for _ in range(BURST // len(clients))
            for client in clients
        ]

        cluster.stop(mode)
        stopped_at = time.monotonic()

        burst_codes: list[grpc.StatusCode] = []
        for future in burst:
            try:
                acked.append(future.result().job.id)
                burst_codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                burst_codes.append(exc.code())
        assert set(burst_codes) <= {grpc.StatusCode.OK, UNAVAILABLE}, burst_codes

        # Down: every call on every replica fails with UNAVAILABLE, and keeps doing so.
        for client in clients:
            for _ in range(3):
                assert rpc_code(client.enqueue, "example.echo") == UNAVAILABLE
                assert rpc_code(client.get, watched) == UNAVAILABLE
                assert rpc_code(client.list_all) == UNAVAILABLE
        # Each replica noticed its LISTEN connection die (and, below, is still running).
        for replica in replicas:
            wait_until(
                functools.partial(replica.events, "storage.listen_failed"),
                timeout=30,
                what="the listener to notice the outage",
            )
        for load in loads:
            wait_until(
                functools.partial(operator.contains, load.codes, UNAVAILABLE),
                timeout=30,
                what="the load to see the outage",
            )
        # For as long as the outage lasts, calls keep failing the same way.
        while time.monotonic() < stopped_at + outage_seconds:
            for client in clients:
                assert rpc_code(client.get, watched) == UNAVAILABLE
            time.sleep(0.5)  # pacing the probes; the outage length is the scenario, not a wait
        assert [replica.returncode for replica in replicas] == [None] * len(replicas)
        down_for = time.monotonic() - stopped_at

        cluster.start()
        restarted_at = time.monotonic()

        # Back: calls succeed again (a few may still fail once, on pooled
        # connections that died with the old server; anything but UNAVAILABLE fails).
        def recovered(client: Client) -> jobs_pb2.Job | None:
            try:
                return client.enqueue("example.sleep", {"seconds": 0.1}, max_attempts=MAX_ATTEMPTS)
            except grpc.RpcError as exc:
                assert exc.code() == UNAVAILABLE, exc
                return None

        for client in clients:
            acked.append(
                wait_until(functools.partial(recovered, client), timeout=60, what="calls to succeed").id
            )
        recovered_after = time.monotonic() - restarted_at
        wait_until(
            lambda: listening_sessions(url) == len(replicas),
            timeout=30,
            what="both replicas to LISTEN again",
        )

        # Work and events cross replicas again: a new job, watched on both
        # replicas from before it ends. Whichever replica runs it, the other's
        # watch hears of its events only through the re-established LISTEN.
        crossing = clients[1].enqueue("example.sleep", {"seconds": 3, "steps": 3}, max_attempts=MAX_ATTEMPTS)
        acked.append(crossing.id)
        crossing_watches = [client.watch(crossing.id, timeout=60) for client in clients]
        firsts = [next(call).event for call in crossing_watches]
        assert [event.type for event in firsts] == ["job.queued"] * len(clients)
        assert clients[0].get(crossing.id).status not in TERMINAL, "the job ended before it was watched"
        crossing_logs = [
            [first, *(response.event for response in call)]
            for first, call in zip(firsts, crossing_watches, strict=True)
        ]

        for load in loads:
            load.finish()
            acked.extend(load.acked)

        # The watch that was open across the outage.
        try:
            watched_events = [response.event for response in watch]
            watch_outcome = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            watched_events, watch_outcome = [], exc.code()
        assert watch_outcome in (grpc.StatusCode.OK, UNAVAILABLE), watch_outcome

        counts = wait_drained(url, timeout=120)
        assert [replica.returncode for replica in replicas] == [None] * len(replicas)
    finally:
        for load in loads:
            load.stop.set()
        for client in clients:
            client.close()
    stop_all(replicas)

    codes = [code for load in loads for code in load.codes]
    print(
        f"mode={mode} down {down_for:.1f}s, calls back {recovered_after:.1f}s after restart, "
        f"acked {len(acked)}, burst {burst_codes.count(grpc.StatusCode.OK)}/{len(burst)} acked, "
        f"load codes { {c.name: codes.count(c) for c in set(codes)} }, watch {watch_outcome.name}, "
        f"final {counts}"
    )
    assert set(codes) <= {grpc.StatusCode.OK, UNAVAILABLE}

    # Every acknowledged job survived and succeeded; so did any whose Enqueue
    # committed but whose answer was lost to the outage.
    rows = job_rows(url)
    assert len(set(acked)) == len(acked)
    assert set(acked) <= set(rows), sorted(set(acked) - set(rows))
    assert counts == {"succeeded": len(rows)}
    logs = event_logs(url)
    assert set(logs) == set(rows)
    lapsed = 0
    for job_id, events in logs.items():
        history = attempt_history(job_id, events)
        assert history and history[-1].closed_by == "job.succeeded", (job_id, history)
        lapsed += sum(attempt.closed_by == "job.lease_expired" for attempt in history)
    print(f"attempts recovered after their lease lapsed: {lapsed}")
    if outage_seconds > LEASE_SECONDS:
        # Jobs were running when the database went, and it stayed down past their
        # leases: their attempts were recovered by a claim, and still succeeded.
        assert lapsed > 0

    if watch_outcome == grpc.StatusCode.OK:
        assert [(e.sequence, e.type) for e in watched_events] == [(e.sequence, e.type) for e in logs[watched]]
    for seen in crossing_logs:
        assert [(e.sequence, e.type) for e in seen] == [(e.sequence, e.type) for e in logs[crossing.id]]
        assert seen[-1].type == "job.succeeded"

"""One replica loses its network path to PostgreSQL for longer than a lease, then gets it back.

Replica A runs in a network namespace of its own (`tests.netns`); replica B
and the database run outside it. A holds four jobs of its own handlers,
mid-run, and a raw worker (this test) holds a remote job's lease through A.
Then an nft rule drops every packet between A and the database, both ways:
no reset and no error, only silence, as a failed switch or a firewall gives.

What must hold:
- A's handlers stop before their leases could lapse (A cannot renew them, and
  running on past the lease would overlap the next holder);
- B takes those jobs once the leases lapse, while the cut lasts, and runs them
  to success; no execution of a job overlaps another (each handler writes its
  start and end on the machine's monotonic clock, one clock for every process);
- A's health turns NOT_SERVING while it cannot reach the database, and its
  calls get UNAVAILABLE (the documented code);
- a late write through A after the heal, the raw worker's Complete with the
  lease B has since replaced, is refused (ABORTED), and B's holder completes;
- once healed, A serves again: health SERVING, and it takes a job;
- every job's log is gap-free with no overlapping attempt.

The timeline (seconds from the cut) is printed for the record.

Mutants this fails on: an executor that lets a handler run on when renewals
stop answering (A's execution overlaps B's); a Complete that skips the lease
token check (the late write lands); libpq's unacknowledged-data timeout back at
30 s (A answers SERVING through the whole cut).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2, worker_pb2, worker_pb2_grpc
from tests.netns import NetworkNamespace, missing
from tests.postgres_cluster import PostgresCluster
from tests.reliability.process_helpers import attempt_history, consistency_problems, event_logs, job_rows
from tests.remote.support import AUTH, TOKEN, worker_stub
from tests.replicas.support import Track, executions, own_cluster, serving, stop_all, wait_drained
from tests.support import require
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import TEST_HANDLERS, Client, Leasehold, cli_args, run_cli, wait_until

pytestmark = pytest.mark.slow

LEASE_SECONDS = 6
FLAGS = (
    *("--handlers", *TEST_HANDLERS),
    *("--remote-kinds", "remote.*"),
    *("--lease-seconds", str(LEASE_SECONDS)),
    *("--rescue-seconds", "0.5"),
    *("--poll-seconds", "0.2"),
    *("--concurrency", "4"),
)
HELD = 4
# Long enough that each of A's handlers is mid-run when the cut comes and would
# still be running when B takes its job, were it not stopped.
JOB_SECONDS = 12.0
# The cut lasts at least this long: four leases, and well past libpq's
# unacknowledged-data timeout (10 s), within which A must turn NOT_SERVING.
CUT_SECONDS = 25.0
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def namespace() -> Iterator[NetworkNamespace]:
    require(missing() is None, f"the partition experiment: {missing()}")
    made = NetworkNamespace()
    try:
        yield made.create()
    finally:
        made.destroy()


@pytest.fixture
def cluster(namespace: NetworkNamespace) -> Iterator[PostgresCluster]:
    """Listening on loopback and on the pair's outer end, letting the inner end in."""
    listen = ("127.0.0.1", namespace.outer_address)
    with own_cluster(durable=True, listen=listen, trust=(f"{namespace.inner_address}/32",)) as own:
        yield own


def _code(call: grpc.UnaryUnaryMultiCallable, request: object, **options: object) -> grpc.StatusCode:
    try:
        call(request, **options)
    except grpc.RpcError as exc:
        code = exc.code()
        assert isinstance(code, grpc.StatusCode), exc
        return code
    return grpc.StatusCode.OK


def _claim_one(stub: object, kind: str) -> worker_pb2.ClaimedJob | None:
    request = worker_pb2.ClaimRequest(worker_id="partition-test", kinds=[kind], wait_seconds=1)
    try:
        answer = stub.Claim(request, metadata=AUTH, timeout=10)  # type: ignore[attr-defined]
    except grpc.RpcError as exc:
        assert exc.code() == UNAVAILABLE, exc
        return None
    return answer.jobs[0] if answer.jobs else None


@dataclass
class Heartbeats:
    """A worker's heartbeat for one lease, once a second until finished."""

    stub: worker_pb2_grpc.WorkerServiceStub
    job_id: str
    lease_token: str
    stop: threading.Event = field(default_factory=threading.Event)
    states: list[worker_pb2.LeaseState] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> Heartbeats:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        beat = worker_pb2.HeartbeatRequest(
            leases=[worker_pb2.LeaseRef(job_id=self.job_id, lease_token=self.lease_token)]
        )
        while not self.stop.wait(1.0):
            self.states.append(self.stub.Heartbeat(beat, metadata=AUTH, timeout=10).states[0])

    def finish(self) -> None:
        """Stop; every renewal was answered and none was lost."""
        self.stop.set()
        assert self.thread is not None
        self.thread.join(30)
        assert self.states and not [state for state in self.states if state.lost], self.states


@pytest.mark.timeout(300)
def test_a_replica_cut_off_from_the_database_hands_its_jobs_over_and_serves_again(
    namespace: NetworkNamespace, cluster: PostgresCluster, processes: Track, tmp_path: Path
) -> None:
    database = cluster.create_database()
    url = cluster.url(database)
    migrated = run_cli("migrate", "--database-url", url)
    assert migrated.returncode == 0, migrated.stderr
    records = tmp_path / "records"
    records.mkdir()
    env = {"LEASEHOLD_WORKER_TOKEN": TOKEN, RECORD_DIR_ENV: str(records)}
    a = processes(
        Leasehold(
            *("serve", "--database-url", cluster.url(database, host=namespace.outer_address)),
            *("--listen", f"{namespace.inner_address}:0", *FLAGS),
            # Off loopback, header auth must be allowed outright: this link is the test's own.
            "--allow-insecure-header-auth",
            env=env,
            command=(*namespace.prefix, *cli_args()),
        )
    )
    a.start(timeout=60)
    client_a = Client(a.port or 0, host=namespace.inner_address)
    worker_channel_a, worker_a = worker_stub(a.port or 0, host=namespace.inner_address)
    b: Leasehold | None = None
    client_b: Client | None = None
    worker_channel_b: grpc.Channel | None = None
    try:
        # A alone: its runtime takes every held job, and the raw worker one remote job's lease.
        held = [
            client_a.enqueue("test.record", {"seconds": JOB_SECONDS}, max_attempts=5).id for _ in range(HELD)
        ]
        wait_until(
            lambda: {record["job_id"] for record in a.events("job.started")} >= set(held),
            timeout=30,
            what="A to run every held job",
        )
        late = client_a.enqueue("remote.late", {}, max_attempts=5).id
        claimed_through_a = wait_until(lambda: _claim_one(worker_a, "remote.late"), 30, "a claim through A")
        assert claimed_through_a.job.id == late
        b = processes(Leasehold.serve(url, *FLAGS, env=env))
        b.start(timeout=60)
        client_b = Client(b.port or 0)
        worker_channel_b, worker_b = worker_stub(b.port or 0)
        assert serving(client_a) and serving(client_b)

        namespace.cut(cluster.port)
        cut_at = time.monotonic()
        timeline: dict[str, float] = {}

        def mark(what: str) -> None:
            timeline[what] = round(time.monotonic() - cut_at, 2)

        wait_until(
            lambda: {record["job_id"] for record in b.events("job.started")} >= set(held),  # type: ignore[union-attr]
            timeout=60,
            what="B to take every held job",
        )
        mark("B runs every held job")
        claimed_through_b = wait_until(lambda: _claim_one(worker_b, "remote.late"), 60, "a claim through B")
        assert claimed_through_b.job.id == late and claimed_through_b.job.attempt == 2
        mark("the remote job claimed again through B")
        # Its new holder heartbeats through B, as a worker does, until it completes.
        beating = Heartbeats(worker_b, late, claimed_through_b.lease_token).start()
        # Within the cut: the writer's next request meets silence and libpq gives up on it.
        wait_until(
            lambda: not serving(client_a),
            timeout=CUT_SECONDS - (time.monotonic() - cut_at),
            what="A to turn NOT_SERVING while the cut lasts",
        )
        mark("A NOT_SERVING")
        request = jobs_pb2.EnqueueRequest(kind="test.record")
        assert _code(client_a.stub.Enqueue, request, metadata=client_a.metadata, timeout=30) == UNAVAILABLE
        mark("A answered UNAVAILABLE")
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))  # the cut's length: the scenario
        namespace.heal()
        mark("healed")

        # The raw worker that held the lease through A finishes late: refused. A worker
        # retries UNAVAILABLE, so it does too while A reconnects.
        stale = worker_pb2.CompleteRequest(job_id=late, lease_token=claimed_through_a.lease_token)
        late_code = wait_until(
            lambda: (
                (code := _code(worker_a.Complete, stale, metadata=AUTH, timeout=10)) != UNAVAILABLE and code
            ),
            timeout=60,
            what="A to answer the late Complete",
        )
        mark("the late write through A answered")
        beating.finish()
        fresh = worker_pb2.CompleteRequest(job_id=late, lease_token=claimed_through_b.lease_token)
        fresh_code = _code(worker_b.Complete, fresh, metadata=AUTH, timeout=10)
        assert fresh_code == grpc.StatusCode.OK, (fresh_code, late_code, timeline)
        wait_until(lambda: serving(client_a), timeout=60, what="A to turn SERVING again")
        mark("A SERVING")
        after = client_a.enqueue("test.record", {"seconds": 0.05}, max_attempts=5).id
        mark("A took a job")

        counts = wait_drained(url, timeout=60)
    finally:
        for channel in (worker_channel_a, worker_channel_b):
            if channel is not None:
                channel.close()
        for opened in (client_a, client_b):
            if opened is not None:
                opened.close()
    assert b is not None
    stop_all([a, b])

    runs = executions(records)
    for job_id in held:
        first, second = runs[job_id]
        timeline[f"A stopped …{job_id[-6:]}"] = round(first["end_monotonic"] - cut_at, 2)
        timeline[f"B started …{job_id[-6:]}"] = round(second["start_monotonic"] - cut_at, 2)
    storage_lines = [
        record["event"] for record in a.records if record.get("event", "").startswith("storage.")
    ]
    print(f"partition timeline (s from the cut): {dict(sorted(timeline.items(), key=lambda item: item[1]))}")
    print(f"A's storage log lines: {storage_lines}")

    assert late_code == grpc.StatusCode.ABORTED
    # A stopped each handler it could not renew, and B ran the job only after.
    assert {record["job_id"] for record in a.events("job.lease_unrenewed")} == set(held)
    for job_id in held:
        first, second = runs[job_id]
        assert (first["pid"], first["outcome"]) == (a.process.pid, "interrupted"), runs[job_id]  # type: ignore[union-attr]
        assert (second["pid"], second["outcome"]) == (b.process.pid, "returned"), runs[job_id]  # type: ignore[union-attr]
        assert second["start_monotonic"] >= first["end_monotonic"], runs[job_id]
        assert first["end_monotonic"] - cut_at < timeline["B runs every held job"]
    # One line each way for the one outage.
    assert len(a.events("storage.unreachable")) == len(a.events("storage.reachable")) == 1
    assert counts == {"succeeded": HELD + 2}
    rows = job_rows(url)
    assert rows[late]["attempt"] == 2 and rows[after]["status"] == "succeeded"
    logs = event_logs(url)
    assert consistency_problems(rows, logs) == []
    for job_id in held:
        history = attempt_history(job_id, logs[job_id])
        assert [attempt.closed_by for attempt in history] == ["job.lease_expired", "job.succeeded"], history

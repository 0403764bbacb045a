"""Shared pieces of the multi-replica tests: direct reads of a PostgreSQL
database's job rows and event logs, replicas started side by side, and
Enqueue calls spread over them.

The event logs are read straight from `job_events`, not through WatchEvents,
so the checks see what the database holds rather than what one replica chooses
to serve; `attempt_history` (tests/reliability/process_helpers.py) then parses
each log strictly, which is what turns "no job ran in two places at once" into
something a test can fail on.
"""

from __future__ import annotations

import collections
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import psycopg
from psycopg.rows import dict_row

from leasehold.v1 import jobs_pb2
from tests.postgres_cluster import PostgresCluster
from tests.reliability.process_helpers import LoggedEvent
from tests.system.helpers import Client, Leasehold, struct

# Every replica loads the same kinds: the built-in examples only.
HANDLERS = ("--handlers", "server.handlers.examples")

# How many Enqueue calls are in flight at once, over all replicas.
ENQUEUE_WINDOW = 200

Track = Callable[[Leasehold], Leasehold]


def database_name(database_url: str) -> str:
    """The database a `postgresql+psycopg://user@host:port/NAME` URL names."""
    name = database_url.rsplit("/", 1)[1].split("?", 1)[0]
    assert name, database_url
    return name


def connect(cluster: PostgresCluster, database_url: str) -> psycopg.Connection[dict[str, Any]]:
    """An autocommit psycopg connection to the URL's database, rows as dicts."""
    return psycopg.connect(
        cluster.conninfo(database_name(database_url)), autocommit=True, row_factory=dict_row
    )


def job_rows(cluster: PostgresCluster, database_url: str) -> dict[str, dict[str, Any]]:
    """Every job row, lease columns included (the API never shows them), by id."""
    with connect(cluster, database_url) as conn:
        rows = conn.execute(
            "SELECT id, kind, status, attempt, max_attempts, lease_owner, lease_token, lease_expires_at,"
            " last_event_sequence FROM jobs"
        ).fetchall()
    return {row["id"]: row for row in rows}


def event_logs(cluster: PostgresCluster, database_url: str) -> dict[str, list[LoggedEvent]]:
    """Every job's event log in sequence order, read in one query; `created_at`
    (integer microseconds in the table) in seconds since the epoch."""
    logs: dict[str, list[LoggedEvent]] = collections.defaultdict(list)
    with connect(cluster, database_url) as conn:
        rows = conn.execute(
            "SELECT job_id, sequence, type, payload, created_at FROM job_events ORDER BY job_id, sequence"
        ).fetchall()
    for row in rows:
        payload = row["payload"]
        assert isinstance(payload, dict), f"payload of {row['job_id']}#{row['sequence']}: {payload!r}"
        logs[row["job_id"]].append(
            LoggedEvent(
                sequence=int(row["sequence"]),
                type=row["type"],
                payload=payload,
                created_at=int(row["created_at"]) / 1_000_000,
            )
        )
    return dict(logs)


def status_counts(cluster: PostgresCluster, database_url: str) -> dict[str, int]:
    """How many jobs are in each status right now."""
    with connect(cluster, database_url) as conn:
        rows = conn.execute("SELECT status, count(*) AS n FROM jobs GROUP BY status").fetchall()
    return {row["status"]: int(row["n"]) for row in rows}


def start_replicas(processes: Track, database_url: str, count: int, *flags: str) -> list[Leasehold]:
    """`count` replicas of `leasehold serve` on one database, launched together
    (so they start up in parallel on two cores) and tracked for cleanup."""
    replicas = [processes(Leasehold.serve(database_url, *flags, *HANDLERS)) for _ in range(count)]
    for replica in replicas:
        replica.launch()
    for replica in replicas:
        replica.wait_started(timeout=60)
    return replicas


def stop_all(replicas: list[Leasehold]) -> None:
    """Ctrl-C every replica (all first, so they shut down in parallel) and wait
    for each to exit cleanly, so that its log is complete when the test reads it."""
    for replica in replicas:
        assert replica.process is not None
        replica.process.send_signal(signal.SIGINT)
    for replica in replicas:
        assert replica.process is not None
        replica.process.wait(30)
        replica.kill()  # a no-op on an exited process, but it joins the log reader
        assert replica.returncode == 0, replica.output[-3000:]


def worker_id(replica: Leasehold) -> str:
    """The replica's worker id, as its `server.started` record names it."""
    (started,) = replica.events("server.started")
    return str(started["worker_id"])


def started_attempts(replica: Leasehold) -> list[tuple[str, int]]:
    """The (job id, attempt) pairs the replica logged as started."""
    return [
        (str(r["job_id"]), int(r["attempt"]))
        for r in list(replica.records)  # a snapshot: the reader thread keeps appending
        if r.get("event") == "job.started"
    ]


def enqueue_spread(
    clients: Sequence[Client], requests: Iterable[jobs_pb2.EnqueueRequest], timeout: float = 60.0
) -> list[str]:
    """Enqueue every request, request i through client i mod n, with up to
    ENQUEUE_WINDOW calls in flight at once; returns the job ids in request order.
    Any failed call fails the test: in a healthy cluster every Enqueue succeeds."""
    ids: list[str] = []
    window: collections.deque[Any] = collections.deque()
    for index, request in enumerate(requests):
        client = clients[index % len(clients)]
        window.append(client.stub.Enqueue.future(request, metadata=client.metadata, timeout=timeout))
        if len(window) >= ENQUEUE_WINDOW:
            ids.append(window.popleft().result().job.id)
    while window:
        ids.append(window.popleft().result().job.id)
    return ids


def sleep_request(seconds: float, steps: int = 1, **fields: Any) -> jobs_pb2.EnqueueRequest:
    """An `example.sleep` job: `steps` progress events over `seconds`."""
    return jobs_pb2.EnqueueRequest(
        kind="example.sleep", payload=struct({"seconds": seconds, "steps": steps}), **fields
    )


def rpc_code(call: Callable[..., object], *args: Any) -> grpc.StatusCode:
    """Make the call; the status code it ended with (OK when it returned)."""
    try:
        call(*args)
    except grpc.RpcError as exc:
        code = exc.code()
        assert isinstance(code, grpc.StatusCode), exc
        return code
    return grpc.StatusCode.OK

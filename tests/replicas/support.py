"""Shared pieces of the multi-replica tests: replicas started side by side,
Enqueue calls spread over them, and a count of jobs by status.

The event logs are read straight from `job_events` (process_helpers.event_logs),
not through WatchEvents, so the checks see what the database holds rather than
what one replica chooses to serve; `attempt_history` then parses each log
strictly, which is what turns "no job ran in two places at once" into something
a test can fail on.
"""

from __future__ import annotations

import collections
import contextlib
import json
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from leasehold.testing import stop_servers
from leasehold.v1 import jobs_pb2
from tests.database_reads import rows
from tests.postgres_cluster import PostgresCluster, find_bin_dir
from tests.support import require
from tests.system.helpers import Client, Leasehold, struct, wait_until

# Every replica loads the same kinds: the built-in examples only.
HANDLERS = ("--handlers", "leasehold.examples")

# How many Enqueue calls are in flight at once, over all replicas.
ENQUEUE_WINDOW = 200

Track = Callable[[Leasehold], Leasehold]


def status_counts(database_url: str) -> dict[str, int]:
    """How many jobs are in each status right now."""
    found = rows(database_url, "SELECT status, count(*) AS n FROM jobs GROUP BY status")
    return {row["status"]: int(row["n"]) for row in found}


def wait_drained(database_url: str, timeout: float) -> dict[str, int]:
    """Once every job has ended: how many ended in each status."""

    def drained() -> dict[str, int] | None:
        counts = status_counts(database_url)
        return counts if set(counts) <= {"succeeded", "failed", "cancelled"} else None

    return wait_until(drained, timeout=timeout, what="every job to finish", interval=0.25)


@contextlib.contextmanager
def own_cluster(**options: Any) -> Iterator[PostgresCluster]:
    """A throwaway cluster of the test's own (`options` as PostgresCluster takes
    them), started, and destroyed at the end whatever happens: for a test that
    stops the database or cuts its network, which would break every other test
    using the session's."""
    bin_dir = find_bin_dir()
    require(bin_dir is not None, "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    assert bin_dir is not None
    own = PostgresCluster(bin_dir, **options)
    try:
        own.init().start()
        yield own
    finally:
        own.destroy()


def start_replicas(
    processes: Track, database_url: str, count: int, *flags: str, **options: Any
) -> list[Leasehold]:
    """`count` replicas of `leasehold serve` on one database, launched together
    (so they start up in parallel on two cores) and tracked for cleanup;
    `options` as Leasehold takes them (env=...)."""
    replicas = [processes(Leasehold.serve(database_url, *flags, *HANDLERS, **options)) for _ in range(count)]
    for replica in replicas:
        replica.launch()
    for replica in replicas:
        replica.wait_started(timeout=60)
    return replicas


def stop_all(replicas: list[Leasehold]) -> None:
    """Ctrl-C every replica (all first, so they shut down in parallel) and wait
    for each to exit cleanly, so that its log is complete when the test reads it."""
    servers = [replica.server for replica in replicas if replica.server is not None]
    codes = stop_servers(servers, timeout=30, signum=signal.SIGINT)
    for replica, code in zip(replicas, codes, strict=True):
        assert code == 0, replica.output[-3000:]


def worker_id(replica: Leasehold) -> str:
    """The replica's worker id, as its `server.started` record names it."""
    started = replica.started.record
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


def serving(client: Client) -> bool:
    """Whether the replica's health reads SERVING now (no answer reads as not)."""
    health = health_pb2_grpc.HealthStub(client.channel)
    try:
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    except grpc.RpcError:
        return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def executions(records: Path) -> dict[str, list[dict[str, Any]]]:
    """Each job's `test.record` / `remote.record` executions, from every process's
    record file, in start order."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in records.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            run = json.loads(line)
            runs.setdefault(run["job_id"], []).append(run)
    return {job_id: sorted(found, key=lambda run: run["start_monotonic"]) for job_id, found in runs.items()}

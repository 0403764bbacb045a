"""Eight `leasehold worker` processes and the in-process runtime drain 2,000
mixed jobs (local and remote kinds) together: on SQLite with one server, on
PostgreSQL with two replicas. Every job succeeds, every attempt runs exactly
once, no two attempts of a job overlap (from the event logs, and from each
execution's own record), and each kind ran only where it is routed."""

from __future__ import annotations

import collections
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import database_reads
from tests.remote.support import attempt_windows, launch_worker, serve, wait_started
from tests.system.helpers import Client, iter_records, wait_until

pytestmark = pytest.mark.slow

JOBS = 2000
WORKERS = 8
ENQUEUERS = 4


# Past pytest's default: the drain's own wait (below) says what is missing.
@pytest.mark.timeout(300)
def test_workers_and_the_in_process_runtime_drain_a_mixed_queue_exactly_once(
    tmp_path: Path, database_url: str, processes
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    replicas = 2 if database_url.startswith("postgresql") else 1
    servers = [serve(processes, database_url, records, "--concurrency", "8") for _ in range(replicas)]
    kinds = enqueue_mixed([server.port for server in servers])
    # Launched together, then awaited: eight interpreters start in parallel.
    workers = [
        launch_worker(processes, servers[index % replicas].port, records, "--concurrency", "8")
        for index in range(WORKERS)
    ]
    for process in workers:
        wait_started(process)
    wait_until(
        lambda: (
            database_reads.scalar(database_url, "SELECT count(*) FROM jobs WHERE status = 'succeeded'")
            == JOBS
        ),
        240,
        "every job to succeed",
        interval=0.5,
    )

    # The event logs: per job, gap-free, one attempt at a time, one success.
    logs: dict[str, list[tuple[int, str, dict[str, object]]]] = collections.defaultdict(list)
    for row in database_reads.rows(
        database_url, "SELECT job_id, sequence, type, payload FROM job_events ORDER BY job_id, sequence"
    ):
        logs[row["job_id"]].append((row["sequence"], row["type"], database_reads.json_column(row["payload"])))
    assert set(logs) == set(kinds)
    for job_id, log in logs.items():
        assert [sequence for sequence, _, _ in log] == list(range(1, len(log) + 1)), job_id
        assert [event_type for _, event_type, _ in log].count("job.succeeded") == 1, log
        attempt_windows((event_type, payload) for _, event_type, payload in log)

    # Each execution's own record: exactly once per attempt, never overlapping,
    # and each kind where it is routed (remote kinds in worker processes only).
    executions = [record for record in iter_records(records) if record["outcome"] == "returned"]
    per_attempt = collections.Counter((record["job_id"], record["attempt"]) for record in executions)
    assert set(per_attempt.values()) == {1}
    assert {job_id for job_id, _ in per_attempt} == set(kinds)
    worker_pids = {process.process.pid for process in workers if process.process is not None}
    server_pids = {process.process.pid for process in servers if process.process is not None}
    for record in executions:
        expected = worker_pids if kinds[record["job_id"]] == "remote.record" else server_pids
        assert record["pid"] in expected, record
    ran_remote = collections.Counter(
        record["pid"] for record in executions if kinds[record["job_id"]] == "remote.record"
    )
    assert len(ran_remote) >= 2, f"the remote jobs should spread over the workers: {json.dumps(ran_remote)}"


def enqueue_mixed(ports: list[int]) -> dict[str, str]:
    """JOBS jobs, alternately local and remote, spread over the replicas by a few
    concurrent clients; returns each job's kind by id."""

    def enqueue_share(share: int) -> dict[str, str]:
        with Client(ports[share % len(ports)]) as client:
            made = {}
            for index in range(share, JOBS, ENQUEUERS):
                kind = "remote.record" if index % 2 else "test.record"
                made[client.enqueue(kind, {"seconds": 0}).id] = kind
            return made

    kinds: dict[str, str] = {}
    with ThreadPoolExecutor(ENQUEUERS) as pool:
        for made in pool.map(enqueue_share, range(ENQUEUERS)):
            kinds.update(made)
    return kinds

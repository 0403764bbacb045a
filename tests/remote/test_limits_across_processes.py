"""Limits hold across every process on the database (DESIGN §11): two
`leasehold serve` replicas on one PostgreSQL database, each running a kind in
process, and eight `leasehold worker` processes claiming a remote kind through
both. The running counts are rebuilt from the event logs the database holds
(each attempt from its `job.started` to the event that ended it), and at no
moment may a kind or an owner have had more running than its limit. A worker
SIGKILLed while it holds a kind's last slot frees it when its lease lapses."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from leasehold.v1 import jobs_pb2
from tests.conftest import Postgres
from tests.database_reads import rows
from tests.remote.support import LEASE_SECONDS, free_port, serve, worker
from tests.system.helpers import Client, wait_until

pytestmark = pytest.mark.slow

OWNERS = ("ann", "ben", "cat")
KIND_LIMITS = {"remote.record": 3, "test.record": 2}
# ann's jobs are all test.record, ben's and cat's remote.record: whenever
# remote.record runs its 3, ben or cat runs 2, and once one of them runs out
# of work the other is held at 2 where its kind would allow 3.
OWNER_LIMIT = 2
LIMIT_FLAGS = (
    "--kind-limit",
    *(f"{kind}={limit}" for kind, limit in KIND_LIMITS.items()),
    "--owner-limit",
    str(OWNER_LIMIT),
)
ENDS = {
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.retry_scheduled",
    "job.lease_expired",
    "job.released",
}


@pytest.fixture
def records(tmp_path: Path) -> Path:
    directory = tmp_path / "records"
    directory.mkdir()
    return directory


@pytest.fixture
def database_url(postgres: Postgres) -> str:
    return postgres.fresh_database_url()


def attempts(database_url: str) -> list[tuple[int, int, str, str]]:
    """Every attempt as (started, ended, kind, owner), from the stored event logs
    (times as stored: microseconds since the epoch)."""
    found = rows(
        database_url,
        "SELECT e.job_id, e.type, e.created_at, j.kind, j.owner_id FROM job_events e "
        "JOIN jobs j ON j.id = e.job_id ORDER BY e.job_id, e.sequence",
    )
    spans: list[tuple[int, int, str, str]] = []
    opened: dict[str, Any] = {}
    for row in found:
        if row["type"] == "job.started":
            opened[row["job_id"]] = row["created_at"]
        elif row["type"] in ENDS and row["job_id"] in opened:
            spans.append((opened.pop(row["job_id"]), row["created_at"], row["kind"], row["owner_id"]))
    assert not opened, f"attempts never ended: {sorted(opened)}"
    return spans


def most_running(spans: list[tuple[int, int, str, str]], key: int) -> Counter[str]:
    """The most attempts of each kind (key 2) or owner (key 3) open at one moment;
    an attempt that ends at the moment another starts has freed its slot."""
    moments = sorted(
        [(span[0], 1, span[key]) for span in spans] + [(span[1], 0, span[key]) for span in spans]
    )
    now: Counter[str] = Counter()
    most: Counter[str] = Counter()
    for _, starts, name in moments:
        now[name] += 1 if starts else -1
        most[name] = max(most[name], now[name])
    return most


def test_kind_and_owner_limits_hold_over_two_replicas_and_eight_remote_workers(
    database_url: str, records: Path, processes
) -> None:
    replicas = [
        serve(processes, database_url, records, *LIMIT_FLAGS, "--concurrency", "8", port=free_port())
        for _ in range(2)
    ]
    clients = [Client(replica.port, owner) for replica in replicas for owner in OWNERS]
    try:
        ids = []
        for index in range(90):
            client = clients[index % len(clients)]
            kind = "remote.record" if index % 3 else "test.record"
            ids.append(client.enqueue(kind, {"seconds": 0.3}).id)
        # The backlog is there before the workers come: 32 remote slots for 3 allowed.
        for index in range(8):
            worker(processes, replicas[index % 2].port, records, "--concurrency", "4")
        wait_until(
            lambda: (
                rows(database_url, "SELECT count(*) AS n FROM jobs WHERE status = 'succeeded'")[0]["n"]
                == len(ids)
                or None
            ),
            120,
            "every job to succeed",
        )
    finally:
        for client in clients:
            client.close()

    spans = attempts(database_url)
    assert len(spans) >= len(ids)
    by_kind = most_running(spans, 2)
    by_owner = most_running(spans, 3)
    for kind, limit in KIND_LIMITS.items():
        assert by_kind[kind] <= limit, (kind, by_kind)
    assert max(by_owner.values()) <= OWNER_LIMIT, by_owner
    # Not vacuous: the limits were reached, so they did the holding back.
    assert by_kind["remote.record"] == KIND_LIMITS["remote.record"], by_kind
    assert max(by_owner.values()) == OWNER_LIMIT, by_owner


def test_a_sigkilled_worker_holding_the_last_slot_frees_it_when_its_lease_lapses(
    tmp_path: Path, database_url: str, records: Path, processes
) -> None:
    server = serve(processes, database_url, records, "--kind-limit", "remote.block=1")
    gate = tmp_path / "gate"
    doomed = worker(processes, server.port, records)
    with Client(server.port) as client:
        first = client.enqueue("remote.block", {"gate": str(gate)})
        client.events_until(first.id, lambda e: e.type == "progress")
        second = client.enqueue("remote.block", {"gate": str(gate)})
        survivor = worker(processes, server.port, records)
        assert client.get(second.id).wait_reason == jobs_pb2.WAIT_REASON_KIND_LIMIT

        doomed.kill()  # SIGKILL while holding the kind's one slot
        gate.touch()
        done = [client.wait_terminal(job.id, timeout=60) for job in (first, second)]

    assert [job.status for job in done] == [jobs_pb2.JOB_STATUS_SUCCEEDED] * 2
    assert done[0].attempt == 2  # its first attempt died with the worker
    spans = attempts(database_url)
    assert most_running(spans, 2)["remote.block"] == 1
    # The slot stayed taken until the lease lapsed: nothing started before then.
    restarts = sorted(start for start, _, _, _ in spans)[1:]
    first_start = min(start for start, _, _, _ in spans)
    assert (restarts[0] - first_start) / 1e6 >= float(LEASE_SECONDS) - 1
    survivor.kill()

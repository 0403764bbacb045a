"""Experiment 8: injected database faults.

A seeded 5% of COMMITs fail as the engine reports a failed commit: on SQLite a
busy database or an I/O error, on PostgreSQL a lock not available, a session
shut down, a broken connection or a deadlock (tests/reliability/faults.py). Every
test runs on both engines. The promise: a caller sees a retryable status
(UNAVAILABLE) and nothing else, a refused write leaves no trace (no job without
its `job.queued` event, no event without its state change), and the runtime
rides out the faults: an outcome whose commit failed is written again while the
lease holds, so a storage blip costs no attempt. The concurrent-claimer,
resource-key and event-sequence experiments run under the same faults in their
own files.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections import Counter
from typing import TypeVar

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold.v1 import jobs_pb2
from tests import database_reads
from tests.api.helpers import Stub, enqueue, struct, wait_for_terminal
from tests.reliability.conftest import Figures
from tests.reliability.faults import commit_faults, retry_unavailable
from tests.reliability.process_helpers import storage_check
from tests.support import Gate, owner_metadata

T = TypeVar("T")

JOBS = 300
PRODUCERS = 4
TERMINAL_EVENTS = {"job.succeeded", "job.failed", "job.cancelled"}


def database_rows(app: LeaseholdApp) -> tuple[dict[str, tuple[str, int]], dict[str, list[tuple[int, str]]]]:
    """Every job's (status, attempt) and every job's event log, read from the
    database directly; the engine's own storage check must pass too."""
    url = app.settings.database_url
    jobs = {
        row["id"]: (row["status"], row["attempt"])
        for row in database_reads.rows(url, "SELECT id, status, attempt FROM jobs")
    }
    events: dict[str, list[tuple[int, str]]] = {}
    for row in database_reads.rows(
        url, "SELECT job_id, sequence, type FROM job_events ORDER BY job_id, sequence"
    ):
        events.setdefault(row["job_id"], []).append((row["sequence"], row["type"]))
    assert storage_check(url) == "ok"
    return jobs, events


def assert_consistent(job_id: str, status: str, attempt: int, log: list[tuple[int, str]]) -> None:
    """A job's row and its log tell the same story: a refused write left neither
    a state change without its event nor an event without its state change."""
    assert [sequence for sequence, _ in log] == list(range(1, len(log) + 1)), (job_id, log)
    types = [event_type for _, event_type in log]
    assert types[0] == "job.queued", (job_id, types)
    assert types.count("job.started") == attempt, (job_id, attempt, types)
    terminal = [event_type for event_type in types if event_type in TERMINAL_EVENTS]
    if status in ("succeeded", "failed", "cancelled"):
        assert terminal == [f"job.{status}"], (job_id, status, types)
    else:
        assert terminal == [], (job_id, status, types)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_five_percent_failed_commits_give_retryable_statuses_and_no_partial_state(
    app: LeaseholdApp, stub: Stub, seed: int, figures: Figures
) -> None:
    codes: Counter[str] = Counter()
    acknowledged: list[str] = []
    cancelled: set[str] = set()
    pick = random.Random(seed)

    async def produce(producer: int) -> None:
        for index in range(producer, JOBS, PRODUCERS):
            # Every fifth job is deduplicated on a resource: the retry after an
            # UNAVAILABLE must find nothing half-created either way.
            resource = {"resource_type": "doc", "resource_id": f"r{index}"} if index % 5 == 0 else {}
            response = await retry_unavailable(
                functools.partial(enqueue, stub, "example.echo", {"n": index}, **resource), codes
            )
            acknowledged.append(response.job.id)
            if pick.random() < 0.1:
                job_id = response.job.id
                request = jobs_pb2.CancelRequest(job_id=job_id)
                await retry_unavailable(
                    functools.partial(stub.Cancel, request, metadata=owner_metadata()), codes
                )
                cancelled.add(job_id)

    with commit_faults(rate=0.05, seed=seed) as faults:
        await asyncio.gather(*(produce(producer) for producer in range(PRODUCERS)))
        finished = [await wait_for_terminal(stub, job_id, timeout=60) for job_id in acknowledged]
        # Reads are not faulted, but the watch streams behind wait_for_terminal
        # must not have seen anything but OK either.

    assert faults.injected > 0, "no fault was injected: the experiment proved nothing"
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    assert codes["UNAVAILABLE"] > 0, "no caller ever saw a fault"
    assert len(set(acknowledged)) == JOBS

    jobs, logs = database_rows(app)
    # Exactly the acknowledged jobs exist: a refused Enqueue created nothing.
    assert set(jobs) == set(acknowledged)
    for job in finished:
        status, attempt = jobs[job.id]
        assert_consistent(job.id, status, attempt, logs[job.id])
        if job.id not in cancelled:
            assert status == "succeeded", (job.id, status, logs[job.id])
            # A failed commit of the outcome is written again while the lease
            # holds; it never costs an attempt or waits for the lease to expire.
            assert attempt == 1, (job.id, attempt, logs[job.id])

    figures(f"seed{seed}.commits", faults.commits)
    figures(f"seed{seed}.commits_failed", faults.injected)
    figures(f"seed{seed}.rpcs_unavailable", codes["UNAVAILABLE"])
    figures(f"seed{seed}.rpcs_ok", codes["OK"])
    figures(f"seed{seed}.faults_by_kind", dict(faults.kinds))

    # Faults gone: the same server takes writes at once, no restart.
    response = await enqueue(stub, "example.echo", {"after": "faults"})
    assert response.created


async def test_an_outcome_whose_commit_fails_is_written_again_within_the_lease(
    app: LeaseholdApp, stub: Stub, gate: Gate
) -> None:
    job = (await enqueue(stub, "test.gate")).job
    await asyncio.wait_for(gate.started.wait(), 15)
    with commit_faults(rate=1.0, seed=0) as faults:
        gate.release.set()
        # Every commit fails until the outcome has been refused a few times.
        while faults.injected < 3:
            await asyncio.sleep(0.01)
    done = await wait_for_terminal(stub, job.id, timeout=15)

    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert done.attempt == 1
    _, logs = database_rows(app)
    assert [event_type for _, event_type in logs[job.id]] == ["job.queued", "job.started", "job.succeeded"]


async def test_a_request_refused_by_a_failed_commit_writes_nothing(app: LeaseholdApp, stub: Stub) -> None:
    with commit_faults(rate=1.0, seed=0):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Enqueue(
                jobs_pb2.EnqueueRequest(
                    kind="example.echo", payload=struct({}), resource_type="doc", resource_id="x"
                ),
                metadata=owner_metadata(),
            )
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "retry" in (refused.value.details() or "")
    jobs, logs = database_rows(app)
    assert jobs == {} and logs == {}
    # The key is free: nothing half-created holds it.
    again = await enqueue(stub, "example.echo", {}, resource_type="doc", resource_id="x")
    assert again.created

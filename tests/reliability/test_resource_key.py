"""Experiment 4 — one resource key, many concurrent callers (DESIGN §3 Dedup).

Promise: with `resource_id` set, Enqueue is idempotent per (owner, resource_type,
resource_id) even under concurrent calls — exactly one root job exists, every caller
gets that job, exactly one caller is told `created = true`, and an OK answer always
names a job that really exists.

How it could fail: a check-then-insert would let two racing callers both insert (two
rows, two `created = true`), or one would be answered with a job id it then cannot
Get; a batch commit that fails half-way could answer OK for a job that was rolled
back. So each round fires 50 Enqueue RPCs at once over real gRPC (spread over five
channels) against the in-process server, with a fresh key per round, then Gets every
id returned and finally counts the rows in the database directly. Every test runs
on both engines: on PostgreSQL the dedup race is decided by the unique index
across concurrent transactions rather than by SQLite's single writer.

The same rounds run again with a seeded 5 % of COMMITs failing
(tests.reliability.faults). A failed commit must surface as UNAVAILABLE; the callers
retry UNAVAILABLE, as any client of a retryable status should, and the same
properties must hold for the answers they end with.

The root-job rule under concurrency (cancelled root, retried, retried again) is the
last test; the sequential case of it (a failed root and one retry) is
tests/api/test_enqueue.py::test_enqueue_after_a_manual_retry_returns_the_newest_job_of_the_resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests import database_reads
from tests.api.helpers import collect_events, struct
from tests.reliability.conftest import Figures
from tests.reliability.faults import commit_faults, retry_unavailable
from tests.support import owner_metadata

ROUNDS = 100
CALLERS = 50
CHANNELS = 5
FAULT_RATE = 0.05
FAULT_SEED = 4
# A caller retrying UNAVAILABLE gives up after this many tries (at a 5 % fault rate,
# even 5 failures in a row for one caller are unlikely; 30 never happen).
MAX_TRIES = 30
RETRY_PAUSE_SECONDS = 0.01
RPC_TIMEOUT_SECONDS = 30.0

Stub = jobs_pb2_grpc.JobServiceStub


@pytest.fixture
async def stubs(app: LeaseholdApp) -> AsyncIterator[list[Stub]]:
    """Several channels to the server, so concurrent calls arrive over separate
    connections as they would from separate client processes."""
    async with contextlib.AsyncExitStack() as stack:
        channels = [
            await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{app.port}"))
            for _ in range(CHANNELS)
        ]
        yield [jobs_pb2_grpc.JobServiceStub(channel) for channel in channels]


async def enqueue_key(
    stub: Stub, resource_type: str, resource_id: str, statuses: Counter[str], retrying: bool
) -> jobs_pb2.EnqueueResponse:
    """One caller: Enqueue the key, counting every status seen; with
    `retrying`, try again after UNAVAILABLE (and only after it)."""
    request = jobs_pb2.EnqueueRequest(
        # Gate jobs hold the app's slots until teardown and the rest stay queued, so
        # running jobs do not compete with the experiment for the two cores.
        kind="test.gate",
        payload=struct({"key": resource_id}),
        resource_type=resource_type,
        resource_id=resource_id,
    )
    return await retry_unavailable(
        lambda: stub.Enqueue(request, metadata=owner_metadata(), timeout=RPC_TIMEOUT_SECONDS),
        statuses,
        tries=MAX_TRIES if retrying else 1,
        pause_seconds=RETRY_PAUSE_SECONDS,
    )


async def get_retrying(stub: Stub, job_id: str) -> jobs_pb2.Job:
    """Get a job; reads take no COMMIT, but retry UNAVAILABLE all the same."""
    request = jobs_pb2.GetRequest(job_id=job_id)
    response = await retry_unavailable(
        lambda: stub.Get(request, metadata=owner_metadata(), timeout=RPC_TIMEOUT_SECONDS),
        tries=MAX_TRIES,
        pause_seconds=RETRY_PAUSE_SECONDS,
    )
    return response.job


def rows_per_key(app: LeaseholdApp, resource_type: str) -> dict[str, list[tuple[str, str | None]]]:
    """(id, retry_of_job_id) of every job of `resource_type`, by resource id, read
    straight from the database."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    for row in database_reads.rows(
        app.settings.database_url,
        "SELECT resource_id, id, retry_of_job_id FROM jobs WHERE resource_type = :type ORDER BY seq",
        type=resource_type,
    ):
        found.setdefault(row["resource_id"], []).append((row["id"], row["retry_of_job_id"]))
    return found


def queued_events_per_job(app: LeaseholdApp, job_ids: list[str]) -> Counter[str]:
    """How many `job.queued` events each job has in the database (one, at sequence 1)."""
    found = database_reads.rows(
        app.settings.database_url,
        "SELECT job_id FROM job_events WHERE type = 'job.queued' AND sequence = 1",
    )
    wanted = set(job_ids)
    return Counter(row["job_id"] for row in found if row["job_id"] in wanted)


async def run_rounds(
    app: LeaseholdApp, stubs: list[Stub], resource_type: str, retrying: bool
) -> tuple[dict[str, str], Counter[str], list[float]]:
    """ROUNDS rounds of CALLERS concurrent Enqueues of one fresh key each; checks
    every round's answers. Returns key -> job id, the statuses seen and the round
    times."""
    statuses: Counter[str] = Counter()
    winners: dict[str, str] = {}
    round_seconds: list[float] = []
    for number in range(ROUNDS):
        key = f"key-{number}"
        began = time.monotonic()
        responses = await asyncio.gather(
            *(
                enqueue_key(stubs[caller % len(stubs)], resource_type, key, statuses, retrying)
                for caller in range(CALLERS)
            )
        )
        round_seconds.append(time.monotonic() - began)

        ids = {response.job.id for response in responses}
        assert len(ids) == 1, f"round {number}: {len(ids)} different jobs for one key: {sorted(ids)}"
        assert sum(response.created for response in responses) == 1, (
            f"round {number}: created=true {sum(r.created for r in responses)} times"
        )
        for response in responses:
            assert (response.job.resource_type, response.job.resource_id) == (resource_type, key)
            assert response.job.retry_of_job_id == ""
        # Never "OK" with nothing behind it: every id answered can be read back.
        for job_id in ids:
            job = await get_retrying(stubs[number % len(stubs)], job_id)
            assert (job.id, job.resource_type, job.resource_id) == (job_id, resource_type, key)
        winners[key] = ids.pop()
    return winners, statuses, round_seconds


def check_database(app: LeaseholdApp, resource_type: str, winners: dict[str, str]) -> None:
    """Exactly one row per key in the database, and it is the job every caller got."""
    stored = rows_per_key(app, resource_type)
    assert sorted(stored) == sorted(winners)
    duplicated = {key: rows for key, rows in stored.items() if len(rows) != 1}
    assert not duplicated, f"keys with more than one job: {duplicated}"
    assert {key: rows[0][0] for key, rows in stored.items()} == winners
    assert all(rows[0][1] is None for rows in stored.values())
    assert queued_events_per_job(app, list(winners.values())) == Counter(
        {job_id: 1 for job_id in winners.values()}
    )


def report(figures: Figures, statuses: Counter[str], round_seconds: list[float]) -> None:
    figures("rounds", ROUNDS)
    figures("callers per round", CALLERS)
    figures("enqueue RPCs answered", sum(statuses.values()))
    figures("round p50 s", statistics.median(round_seconds))
    figures("round max s", max(round_seconds))


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_fifty_concurrent_enqueues_of_a_key_create_one_job_every_round(
    app: LeaseholdApp, stubs: list[Stub], figures: Figures
) -> None:
    """No faults: every call must be answered OK, first time."""
    winners, statuses, round_seconds = await run_rounds(app, stubs, "doc", retrying=False)

    assert statuses == Counter({"OK": ROUNDS * CALLERS})
    check_database(app, "doc", winners)
    report(figures, statuses, round_seconds)


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_concurrent_enqueues_of_a_key_under_commit_faults_still_create_one_job(
    app: LeaseholdApp, stubs: list[Stub], figures: Figures
) -> None:
    """5 % of COMMITs fail; callers retry UNAVAILABLE. The answers they end with
    must satisfy the same rules, and no other status may appear."""
    with commit_faults(rate=FAULT_RATE, seed=FAULT_SEED) as faults:
        winners, statuses, round_seconds = await run_rounds(app, stubs, "doc", retrying=True)

    assert faults.injected > 0, "no fault was injected: the variant proved nothing"
    assert statuses["UNAVAILABLE"] > 0, "faults were injected but no caller saw UNAVAILABLE"
    assert set(statuses) <= {"OK", "UNAVAILABLE"}, statuses
    assert statuses["OK"] == ROUNDS * CALLERS
    check_database(app, "doc", winners)
    report(figures, statuses, round_seconds)
    figures("commits", faults.commits)
    figures("commit faults injected", faults.injected)
    figures("UNAVAILABLE answers (retried)", statuses["UNAVAILABLE"])
    figures("commit faults by kind", dict(faults.kinds))


# ----- the root-job rule, concurrently ---------------------------------------------

KEYS = 5
LONG_SLEEP = {"seconds": 60, "steps": 600}  # runs until cancelled; stops within 0.1 s


async def _cancel_and_wait(stub: Stub, job_id: str) -> None:
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=job_id), metadata=owner_metadata())
    events = await collect_events(stub, job_id, timeout=20)
    assert events[-1].type == "job.cancelled", [event.type for event in events]


async def _retry(stub: Stub, job_id: str) -> jobs_pb2.Job:
    return (await stub.Retry(jobs_pb2.RetryRequest(job_id=job_id), metadata=owner_metadata())).job


async def _burst(stubs: list[Stub], key: str) -> list[jobs_pb2.EnqueueResponse]:
    request = jobs_pb2.EnqueueRequest(
        kind="example.sleep", payload=struct(LONG_SLEEP), resource_type="rule", resource_id=key
    )
    return await asyncio.gather(
        *(stubs[i % len(stubs)].Enqueue(request, metadata=owner_metadata()) for i in range(CALLERS))
    )


async def _root_rule_for_key(stubs: list[Stub], key: str) -> tuple[str, list[str]]:
    stub = stubs[0]
    first = await _burst(stubs, key)
    assert sum(response.created for response in first) == 1
    root = first[0].job.id
    assert {response.job.id for response in first} == {root}

    await _cancel_and_wait(stub, root)
    child = await _retry(stub, root)
    assert child.retry_of_job_id == root
    again = await _burst(stubs, key)
    assert {response.job.id for response in again} == {child.id}
    assert not any(response.created for response in again)

    await _cancel_and_wait(stub, child.id)
    grandchild = await _retry(stub, child.id)
    second_child = await _retry(stub, root)  # the newest job of the resource
    assert (grandchild.retry_of_job_id, second_child.retry_of_job_id) == (child.id, root)
    last = await _burst(stubs, key)
    assert {response.job.id for response in last} == {second_child.id}
    assert not any(response.created for response in last)

    for job_id in (grandchild.id, second_child.id):
        await _cancel_and_wait(stub, job_id)
    return root, [child.id, grandchild.id, second_child.id]


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_after_cancel_and_retry_concurrent_enqueues_return_the_newest_job(
    app: LeaseholdApp, stubs: list[Stub], figures: Figures
) -> None:
    """DESIGN §3 Dedup: manual retries are children of the root, not duplicates, and
    repeating the Enqueue — 50 callers at once — returns the most recent job of the
    resource with created=false, never a second root."""
    results = await asyncio.gather(*(_root_rule_for_key(stubs, f"rule-{n}") for n in range(KEYS)))

    stored = rows_per_key(app, "rule")
    assert sorted(stored) == sorted(f"rule-{n}" for n in range(KEYS))
    for n, (root, children) in enumerate(results):
        rows = stored[f"rule-{n}"]
        assert [job_id for job_id, _ in rows] == [root, *children]
        assert [job_id for job_id, retry_of in rows if retry_of is None] == [root], rows
    figures("keys", KEYS)
    figures("enqueue RPCs", KEYS * 3 * CALLERS)

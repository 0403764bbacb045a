"""AdminService.ListWorkers through a real server and channel (--auth token), on
each SQL engine: a worker that claims through WorkerService is listed with the
kinds it asked for, the jobs whose leases it holds and whether a Claim of its
waits now; the in-process runtime's own leases are no remote worker's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from leasehold._server.app import LeaseholdApp
from leasehold.v1 import admin_pb2, jobs_pb2, worker_pb2
from tests.admin.helpers import Credentials, Metadata, Stubs, admin_server, credentials, enqueue, stubs
from tests.api.helpers import WAIT, struct

WorkerCheck = Callable[[admin_pb2.ListWorkersResponse], bool]


@pytest.fixture
async def served(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Stubs, Credentials, LeaseholdApp]]:
    creds = credentials(tmp_path)
    async with admin_server(database_url, creds) as app, stubs(app) as s:
        yield s, creds, app


async def _listed(s: Stubs, creds: Credentials) -> admin_pb2.ListWorkersResponse:
    response: admin_pb2.ListWorkersResponse = await s.admin.ListWorkers(
        admin_pb2.ListWorkersRequest(), metadata=creds.admin
    )
    return response


async def _started(s: Stubs, job_id: str, owner: Metadata) -> None:
    call = s.jobs.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id), metadata=owner)
    try:
        async with asyncio.timeout(WAIT):
            async for response in call:
                if response.event.type == "job.started":
                    return
    finally:
        call.cancel()
    raise AssertionError(f"job {job_id} ended without starting")


async def _until(s: Stubs, creds: Credentials, check: WorkerCheck) -> admin_pb2.ListWorkersResponse:
    """ListWorkers again until `check` holds (a Claim another task sends has
    reached the server), for at most WAIT seconds."""
    async with asyncio.timeout(WAIT):
        while not check(found := await _listed(s, creds)):
            await asyncio.sleep(0.02)
    return found


async def test_a_claiming_worker_is_listed_with_its_kinds_and_the_jobs_it_holds(
    served: tuple[Stubs, Credentials, LeaseholdApp],
) -> None:
    s, creds, _ = served
    before = datetime.now(UTC).replace(microsecond=0)
    alice, bob = creds.owner("alice"), creds.owner("bob")
    assert (await _listed(s, creds)).workers == []
    local = await enqueue(s, alice, "example.sleep", payload=struct({"seconds": 30}))
    await _started(s, local, alice)  # the in-process runtime holds its lease
    await enqueue(s, alice)
    await enqueue(s, bob)
    claimed = await s.worker.Claim(
        worker_pb2.ClaimRequest(worker_id="w-media", kinds=["media.resize", "report.x"], max_jobs=5),
        metadata=creds.worker,
    )
    assert len(claimed.jobs) == 2

    (worker,) = (await _listed(s, creds)).workers
    assert (worker.worker_id, list(worker.kinds), worker.jobs_held) == (
        "w-media",
        ["media.resize", "report.x"],
        2,
    )
    assert not worker.claiming
    assert before <= worker.last_seen_at.ToDatetime(UTC) <= datetime.now(UTC)

    waiting = asyncio.ensure_future(
        s.worker.Claim(
            worker_pb2.ClaimRequest(worker_id="w-idle", kinds=["report.x"], wait_seconds=WAIT),
            metadata=creds.worker,
        )
    )
    try:
        found = await _until(s, creds, lambda r: any(w.claiming for w in r.workers))
        assert [(w.worker_id, w.jobs_held, w.claiming) for w in found.workers] == [
            ("w-idle", 0, True),
            ("w-media", 2, False),
        ]
        assert not found.truncated
        await enqueue(s, bob, "report.x")  # ends the waiting Claim with a job
        assert len((await asyncio.wait_for(waiting, WAIT)).jobs) == 1
    finally:
        waiting.cancel()
    held = {w.worker_id: (w.jobs_held, w.claiming) for w in (await _listed(s, creds)).workers}
    assert held == {"w-idle": (1, False), "w-media": (2, False)}

    for job in claimed.jobs:
        await s.worker.Complete(
            worker_pb2.CompleteRequest(job_id=job.job.id, lease_token=job.lease_token), metadata=creds.worker
        )
    after = {w.worker_id: w.jobs_held for w in (await _listed(s, creds)).workers}
    assert after == {"w-idle": 1, "w-media": 0}  # still on the roster: seen within a lease
    got = await s.jobs.Get(jobs_pb2.GetRequest(job_id=local), metadata=alice)
    assert got.job.status == jobs_pb2.JOB_STATUS_RUNNING  # the runtime's lease never showed


async def test_another_replica_lists_the_worker_by_the_leases_it_holds(
    database_url: str, tmp_path: Path
) -> None:
    creds = credentials(tmp_path)
    async with (
        admin_server(database_url, creds) as first,
        admin_server(database_url, creds) as second,
        stubs(first) as here,
        stubs(second) as there,
    ):
        await enqueue(here, creds.owner("alice"))
        await enqueue(here, creds.owner("alice"), "media.crop")
        claimed = await here.worker.Claim(
            worker_pb2.ClaimRequest(
                worker_id="w-1", kinds=["media.resize", "media.crop", "report.x"], max_jobs=5
            ),
            metadata=creds.worker,
        )
        assert len(claimed.jobs) == 2

        (on_first,) = (await _listed(here, creds)).workers
        (on_second,) = (await _listed(there, creds)).workers

    assert (on_first.worker_id, list(on_first.kinds), on_first.jobs_held) == (
        "w-1",
        ["media.crop", "media.resize", "report.x"],  # what its Claim asked for
        2,
    )
    assert (on_second.worker_id, list(on_second.kinds), on_second.jobs_held) == (
        "w-1",
        ["media.crop", "media.resize"],  # the kinds of the jobs it holds: it never claimed there
        2,
    )
    assert on_second.last_seen_at == on_first.last_seen_at  # its lease, as the database holds it
    assert not on_second.claiming

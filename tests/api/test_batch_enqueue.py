"""BatchEnqueue over gRPC (DESIGN §15): 1-1,000 Enqueue requests in one
transaction, refused whole when any item is invalid (naming `requests[i].<field>`),
each item deduplicated as Enqueue would, answers in request order."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from leasehold.worker import HandlerRegistry
from tests.api.helpers import (
    enqueue,
    error_reason,
    expect_error,
    expect_invalid,
    get_job,
    list_all,
    struct,
)
from tests.api.test_status_codes import ENQUEUE_CASES, PAYLOAD_LIMIT
from tests.database_reads import rows, scalar
from tests.support import OTHER_OWNER, OWNER, owner_metadata

Stub = jobs_pb2_grpc.JobServiceStub
TOKEN = secrets.token_urlsafe(24)
GRPC_MESSAGE_CAP = 4 * 1024 * 1024


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    """A worker token, so that the test below can show it is no owner."""
    return {"worker_token": TOKEN}


def item(
    kind: str = "example.echo", payload: dict[str, Any] | None = None, **fields: Any
) -> jobs_pb2.EnqueueRequest:
    return jobs_pb2.EnqueueRequest(kind=kind, payload=struct(payload), **fields)


def keyed(resource_id: str, **fields: Any) -> jobs_pb2.EnqueueRequest:
    return item(**{"resource_type": "doc", "resource_id": resource_id, **fields})


async def batch_enqueue(
    stub: Stub, items: Sequence[jobs_pb2.EnqueueRequest], *, owner: str = OWNER
) -> list[jobs_pb2.EnqueueResponse]:
    request = jobs_pb2.BatchEnqueueRequest(requests=items)
    response = await stub.BatchEnqueue(request, metadata=owner_metadata(owner))
    return list(response.responses)


async def stored(database_url: str) -> tuple[int, int]:
    """(jobs, job events) in the whole database, every owner's."""
    jobs = await asyncio.to_thread(scalar, database_url, "SELECT count(*) FROM jobs")
    events = await asyncio.to_thread(scalar, database_url, "SELECT count(*) FROM job_events")
    return jobs, events


# ----- what a batch creates -----------------------------------------------------------------


async def test_a_batch_answers_each_request_in_order(stub, app):
    items = [
        item(payload={"i": 0}),
        keyed("a", max_attempts=5),
        item("example.sleep", {"seconds": 0}, timeout_seconds=7),
        keyed("b"),
        item(),
    ]

    responses = await batch_enqueue(stub, items)

    assert [response.created for response in responses] == [True] * 5
    jobs = [response.job for response in responses]
    assert len({job.id for job in jobs}) == 5
    assert [job.kind for job in jobs] == [request.kind for request in items]
    assert [job.resource_id for job in jobs] == ["", "a", "", "b", ""]
    assert (jobs[1].max_attempts, jobs[1].timeout_seconds) == (5, 900)
    assert (jobs[2].max_attempts, jobs[2].timeout_seconds) == (3, 7)
    assert all(job.status == jobs_pb2.JOB_STATUS_QUEUED for job in jobs)
    for job in jobs:
        assert (await get_job(stub, job.id)).id == job.id
    # Newest first, and the batch was stored in request order.
    assert [job.id for job in await list_all(stub)] == [job.id for job in reversed(jobs)]


async def test_each_created_job_has_its_queued_event(stub, app, database_url):
    responses = await batch_enqueue(stub, [item(), keyed("e"), keyed("e"), item()])

    created = {response.job.id for response in responses}
    first_events = await asyncio.to_thread(
        rows, database_url, "SELECT job_id, type FROM job_events WHERE sequence = 1"
    )
    assert {(row["job_id"], row["type"]) for row in first_events} == {
        (job_id, "job.queued") for job_id in created
    }
    assert len(first_events) == 3


async def test_a_resource_that_has_a_job_gets_it_back_not_created(stub, app):
    existing = await enqueue(stub, resource_type="doc", resource_id="7")

    responses = await batch_enqueue(stub, [item(), keyed("7"), keyed("8")])

    assert [response.created for response in responses] == [True, False, True]
    assert responses[1].job.id == existing.job.id
    assert responses[1].job.created_at == existing.job.created_at


async def test_a_resource_named_twice_in_one_batch_is_one_job(stub, app):
    responses = await batch_enqueue(stub, [keyed("x"), item(), keyed("x"), keyed("x", payload={"v": 2})])

    assert [response.created for response in responses] == [True, True, False, False]
    assert responses[2].job == responses[0].job == responses[3].job
    assert [job.id for job in await list_all(stub, resource_type="doc", resource_id="x")] == [
        responses[0].job.id
    ]


async def test_another_owners_resource_neither_collides_nor_leaks(stub, app):
    theirs = await enqueue(stub, resource_type="doc", resource_id="shared", owner=OTHER_OWNER)

    (mine,) = await batch_enqueue(stub, [keyed("shared")])
    (again,) = await batch_enqueue(stub, [keyed("shared")], owner=OTHER_OWNER)

    assert mine.created is True and mine.job.id != theirs.job.id
    assert again.created is False and again.job.id == theirs.job.id
    assert [job.id for job in await list_all(stub)] == [mine.job.id]
    assert [job.id for job in await list_all(stub, owner=OTHER_OWNER)] == [theirs.job.id]


async def test_a_thousand_items_are_accepted(stub, app):
    items = [item(payload={"i": i}) for i in range(990)] + [keyed(str(i % 5)) for i in range(10)]

    responses = await batch_enqueue(stub, items)

    assert len(responses) == 1000
    assert sum(response.created for response in responses) == 995
    assert [response.job.resource_id for response in responses[990:]] == [str(i % 5) for i in range(10)]


# ----- what a batch refuses, and that it then wrote nothing -----------------------------------

BATCH_CASES = [case for case in ENQUEUE_CASES if case[0] != "payload over 256 KiB"]


@pytest.mark.parametrize(
    ("fields", "field"), [case[1:] for case in BATCH_CASES], ids=[case[0] for case in BATCH_CASES]
)
async def test_one_bad_item_refuses_the_batch_naming_it_and_writes_nothing(
    stub, app, database_url, fields, field
):
    bad = {"kind": "example.echo", **fields}
    # Good items before it (a resource's first job among them) and after it.
    items = [item(), keyed("before"), item(), item(**bad), keyed("after")]
    before = await stored(database_url)

    err = await expect_invalid(
        stub.BatchEnqueue(jobs_pb2.BatchEnqueueRequest(requests=items), metadata=owner_metadata()),
        f"requests[3].{field}",
    )

    # The same words as Enqueue's, under the item's place in the batch.
    alone = await expect_invalid(stub.Enqueue(item(**bad), metadata=owner_metadata()), field)
    assert err.details() == f"requests[3].{alone.details()}"
    assert error_reason(err) == "INVALID_ARGUMENT"
    assert await stored(database_url) == before
    (retried,) = await batch_enqueue(stub, [keyed("before")])
    assert retried.created is True


async def test_the_bad_items_index_is_its_place_in_the_batch(stub, app, database_url):
    good = [item() for _ in range(999)]
    for index, bad in (
        (0, item(max_attempts=-1)),
        (999, item(kind="example.unknown")),
        (500, item(payload={"blob": "x" * PAYLOAD_LIMIT})),
    ):
        items = [*good[:index], bad, *good[index:]]
        field = {0: "max_attempts", 999: "kind", 500: "payload"}[index]
        await expect_invalid(
            stub.BatchEnqueue(jobs_pb2.BatchEnqueueRequest(requests=items), metadata=owner_metadata()),
            f"requests[{index}].{field}",
        )
    assert await stored(database_url) == (0, 0)


async def test_the_first_bad_item_is_the_one_named(stub, app):
    items = [item(), item(timeout_seconds=-1), item(kind="")]

    await expect_invalid(
        stub.BatchEnqueue(jobs_pb2.BatchEnqueueRequest(requests=items), metadata=owner_metadata()),
        "requests[1].timeout_seconds",
    )


@pytest.mark.parametrize("count", [0, 1001])
async def test_an_empty_or_oversized_batch_is_invalid_argument_naming_requests(
    stub, app, database_url, count
):
    items = [item() for _ in range(count)]

    err = await expect_invalid(
        stub.BatchEnqueue(jobs_pb2.BatchEnqueueRequest(requests=items), metadata=owner_metadata()), "requests"
    )

    assert "1-1000" in (err.details() or "")
    assert await stored(database_url) == (0, 0)


async def test_a_batch_over_the_message_limit_is_refused_by_grpc_and_writes_nothing(stub, app, database_url):
    # Every item within its own payload limit; all of them over 4 MiB together.
    items = [item(payload={"blob": "x" * (PAYLOAD_LIMIT - 64)}) for _ in range(17)]
    assert jobs_pb2.BatchEnqueueRequest(requests=items).ByteSize() > GRPC_MESSAGE_CAP

    await expect_error(
        stub.BatchEnqueue(jobs_pb2.BatchEnqueueRequest(requests=items), metadata=owner_metadata()),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )

    assert await stored(database_url) == (0, 0)


async def test_a_batch_needs_an_owner_and_refuses_the_worker_credential(stub, app, database_url):
    request = jobs_pb2.BatchEnqueueRequest(requests=[item()])

    missing = await expect_error(stub.BatchEnqueue(request), grpc.StatusCode.UNAUTHENTICATED)
    worker = await expect_error(
        stub.BatchEnqueue(request, metadata=(("authorization", f"Bearer {TOKEN}"), ("x-owner-id", OWNER))),
        grpc.StatusCode.UNAUTHENTICATED,
    )

    assert error_reason(missing) == error_reason(worker) == "OWNER_UNRESOLVED"
    assert "worker credential" in (worker.details() or "")
    assert await stored(database_url) == (0, 0)


# ----- concurrency ------------------------------------------------------------------------------


def overlapping_batches(count: int, keys: Sequence[str]) -> list[list[jobs_pb2.EnqueueRequest]]:
    """`count` batches that each name every key (each starting at another one),
    plus one job of their own."""
    return [
        [keyed(key) for key in (*keys[i % len(keys) :], *keys[: i % len(keys)])] + [item()]
        for i in range(count)
    ]


def assert_one_job_per_key(
    results: Sequence[Sequence[jobs_pb2.EnqueueResponse]], keys: Sequence[str]
) -> None:
    ids: dict[str, set[str]] = {key: set() for key in keys}
    created = dict.fromkeys(keys, 0)
    for responses in results:
        assert responses[-1].created is True
        for response in responses[:-1]:
            ids[response.job.resource_id].add(response.job.id)
            created[response.job.resource_id] += response.created
    assert all(len(found) == 1 for found in ids.values()), ids
    assert created == dict.fromkeys(keys, 1)


async def test_concurrent_overlapping_batches_make_one_job_per_resource(stub, app):
    keys = [f"k{i}" for i in range(8)]
    batches = overlapping_batches(6, keys)

    results = await asyncio.gather(*(batch_enqueue(stub, batch) for batch in batches))

    assert_one_job_per_key(results, keys)
    assert len(await list_all(stub)) == len(keys) + len(batches)


@pytest.fixture
async def second_server(
    database_url: str, registry: HandlerRegistry, runtime_settings: RuntimeSettings
) -> AsyncIterator[Stub]:
    """Another service on the same database, with its own writer and connections."""
    settings = Settings(database_url=database_url, listen="127.0.0.1:0", runtime=runtime_settings)
    service = LeaseholdApp(settings, clock=SystemClock(), registry=registry)
    await service.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            yield jobs_pb2_grpc.JobServiceStub(channel)
    finally:
        await service.stop(grace_seconds=0.5)


async def test_overlapping_batches_on_two_servers_make_one_job_per_resource(stub, app, second_server):
    # On PostgreSQL the two writers' transactions really overlap: the unique
    # index, not this process, decides which batch creates each job.
    keys = [f"k{i}" for i in range(10)]
    batches = overlapping_batches(8, keys)

    results = await asyncio.gather(
        *(batch_enqueue(stub if i % 2 else second_server, batch) for i, batch in enumerate(batches))
    )

    assert_one_job_per_key(results, keys)
    assert len(await list_all(stub)) == len(keys) + len(batches)

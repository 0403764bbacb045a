"""Get and List: newest first, keyset pages, filters, owner isolation (DESIGN §2)."""

from __future__ import annotations

import asyncio

from google.protobuf import timestamp_pb2

from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    enqueue,
    fill_slots,
    get_job,
    list_all,
    list_jobs,
    start_gate_job,
    wait_for_terminal,
)
from tests.support import OTHER_OWNER, OWNER, owner_metadata


def _seconds(stamp: timestamp_pb2.Timestamp) -> float:
    return stamp.seconds + stamp.nanos / 1e9


async def _enqueue_many(stub, count: int, kind: str = "test.gate", owner: str = OWNER) -> list[str]:
    """`count` jobs, one after another, so their order is known; oldest first."""
    return [(await enqueue(stub, kind, owner=owner)).job.id for _ in range(count)]


async def test_get_of_a_finished_job_shows_its_whole_life(stub, app):
    created = (await enqueue(stub, "example.echo", {"n": 1})).job
    await wait_for_terminal(stub, created.id)

    job = await get_job(stub, created.id)

    assert job.id == created.id and job.kind == "example.echo"
    assert job.status == SUCCEEDED
    assert job.attempt == 1
    assert job.error_message == "" and job.error_type == ""
    assert job.created_at == created.created_at
    assert _seconds(job.created_at) <= _seconds(job.started_at) <= _seconds(job.completed_at)
    assert _seconds(job.updated_at) == _seconds(job.completed_at)
    assert not job.HasField("cancel_requested_at")


async def test_list_is_newest_first(stub, app):
    ids = await _enqueue_many(stub, 5)

    listed = (await list_jobs(stub)).jobs

    assert [job.id for job in listed] == ids[::-1]
    stamps = [_seconds(job.created_at) for job in listed]
    assert stamps == sorted(stamps, reverse=True)


async def test_pages_of_two_walk_five_jobs_without_duplicates(stub, app):
    ids = await _enqueue_many(stub, 5)

    pages = []
    token = ""
    while True:
        page = await list_jobs(stub, page_size=2, page_token=token)
        pages.append([job.id for job in page.jobs])
        token = page.next_page_token
        if not token:
            break

    assert [len(page) for page in pages] == [2, 2, 1]
    assert [job_id for page in pages for job_id in page] == ids[::-1]


async def test_last_full_page_has_no_next_token(stub, app):
    ids = await _enqueue_many(stub, 4)

    first = await list_jobs(stub, page_size=2)
    second = await list_jobs(stub, page_size=2, page_token=first.next_page_token)

    assert first.next_page_token
    assert [job.id for job in (*first.jobs, *second.jobs)] == ids[::-1]
    assert second.next_page_token == ""


async def test_jobs_enqueued_during_a_walk_neither_repeat_nor_shift_later_pages(stub, app):
    ids = await _enqueue_many(stub, 5)

    first = await list_jobs(stub, page_size=2)
    newer = await _enqueue_many(stub, 3)
    rest = await list_all(stub, page_size=2, page_token=first.next_page_token)

    assert [job.id for job in (*first.jobs, *rest)] == ids[::-1]
    assert [job.id for job in await list_all(stub)] == newer[::-1] + ids[::-1]


async def test_page_size_zero_means_fifty(stub, app):
    ids = await _enqueue_many(stub, 53)

    first = await list_jobs(stub, page_size=0)
    second = await list_jobs(stub, page_size=0, page_token=first.next_page_token)

    assert len(first.jobs) == 50 and first.next_page_token
    assert len(second.jobs) == 3 and second.next_page_token == ""
    assert [job.id for job in (*first.jobs, *second.jobs)] == ids[::-1]


async def test_page_size_above_the_cap_is_lowered_to_500(stub, app):
    # 501 jobs, enqueued concurrently (group commit keeps this quick); only the gate
    # kind, so at most four of them ever run.
    await asyncio.gather(*(enqueue(stub, "test.gate") for _ in range(501)))

    capped = await list_jobs(stub, page_size=10_000)
    rest = await list_jobs(stub, page_size=10_000, page_token=capped.next_page_token)

    assert len(capped.jobs) == 500 and capped.next_page_token
    assert len(rest.jobs) == 1 and rest.next_page_token == ""
    assert len({job.id for job in (*capped.jobs, *rest.jobs)}) == 501


async def test_large_page_size_returns_everything_when_fewer_jobs_exist(stub, app):
    ids = await _enqueue_many(stub, 7)
    page = await list_jobs(stub, page_size=10_000)
    assert [job.id for job in page.jobs] == ids[::-1]
    assert page.next_page_token == ""


async def test_list_filters_by_status(stub, app):
    succeeded = (await enqueue(stub, "example.echo")).job.id
    failed = (await enqueue(stub, "example.fail", {"message": "boom"}, max_attempts=1)).job.id
    await wait_for_terminal(stub, succeeded)
    await wait_for_terminal(stub, failed)
    running = await fill_slots(stub)
    queued = (await enqueue(stub, "example.echo")).job.id
    cancelled = (await enqueue(stub, "example.echo")).job.id
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=cancelled), metadata=owner_metadata())

    async def ids(*statuses: int) -> set[str]:
        return {job.id for job in await list_all(stub, statuses=list(statuses))}

    assert await ids(SUCCEEDED) == {succeeded}
    assert await ids(FAILED) == {failed}
    assert await ids(RUNNING) == set(running)
    assert await ids(QUEUED) == {queued}
    assert await ids(CANCELLED) == {cancelled}
    assert await ids(FAILED, CANCELLED) == {failed, cancelled}
    assert await ids(SUCCEEDED, SUCCEEDED) == {succeeded}
    assert await ids() == {succeeded, failed, queued, cancelled, *running}


async def test_list_filters_by_kind_and_resource(stub, app):
    doc1 = (await enqueue(stub, "test.gate", resource_type="doc", resource_id="1")).job.id
    doc2 = (await enqueue(stub, "test.gate", resource_type="doc", resource_id="2")).job.id
    image1 = (await enqueue(stub, "example.echo", resource_type="image", resource_id="1")).job.id
    bare = (await enqueue(stub, "example.echo")).job.id

    async def ids(**filters: object) -> list[str]:
        return [job.id for job in await list_all(stub, **filters)]

    assert await ids(kind="test.gate") == [doc2, doc1]
    assert await ids(kind="example.echo") == [bare, image1]
    assert await ids(kind="example.sleep") == []
    assert await ids(resource_type="doc") == [doc2, doc1]
    assert await ids(resource_id="1") == [image1, doc1]
    assert await ids(resource_type="doc", resource_id="1") == [doc1]
    assert await ids(resource_type="image", kind="test.gate") == []


async def test_filtered_pages_walk_only_matching_jobs(stub, app):
    wanted = []
    for index in range(6):
        wanted.append((await enqueue(stub, "test.gate", resource_type="doc", resource_id=str(index))).job.id)
        await enqueue(stub, "test.gate", resource_type="image", resource_id=str(index))

    walked = await list_all(stub, page_size=4, resource_type="doc")

    assert [job.id for job in walked] == wanted[::-1]


async def test_list_never_shows_another_owners_jobs(stub, app):
    mine = await _enqueue_many(stub, 3, owner=OWNER)
    theirs = await _enqueue_many(stub, 2, owner=OTHER_OWNER)

    assert [job.id for job in await list_all(stub, owner=OWNER)] == mine[::-1]
    assert [job.id for job in await list_all(stub, owner=OTHER_OWNER, page_size=1)] == theirs[::-1]
    assert await list_all(stub, owner="carol") == []
    # Not with a filter that matches the other owner's jobs either.
    assert await list_all(stub, owner="carol", kind="test.gate") == []


async def test_get_reflects_the_current_state(stub, app):
    job = await start_gate_job(stub)
    assert job.status == RUNNING and job.attempt == 1 and job.HasField("started_at")
    assert not job.HasField("completed_at")

"""The owner's feed on every engine: each owner's events numbered 1, 2, 3 …
in commit order, followed from any position (replayed, then live), filtered,
isolated between owners, and refused once retention has deleted past it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import FeedPositionExpired, InvalidArgument, ServerDraining
from leasehold._server.jobs.owner_feed import FeedFilter, encode_position, follow_feed
from leasehold._server.jobs.records import FeedEvent, FeedHead, NewJob
from leasehold._server.jobs.repository import JobRepository
from tests.contract.helpers import LEASE, enqueue
from tests.support import OWNER

OTHER = "someone-else"
SOON = 5.0
EVERYTHING = FeedFilter()


async def take(stream: AsyncIterator[FeedEvent], count: int) -> list[FeedEvent]:
    return [await asyncio.wait_for(anext(stream), SOON) for _ in range(count)]


async def run_one(repository: JobRepository, owner: str = OWNER, kind: str = "example.echo") -> str:
    """A job enqueued, claimed, given one event of its own and succeeded: four events."""
    job_id = await enqueue(repository, owner_id=owner, kind=kind, resource_type="order", resource_id=kind)
    (claimed,) = (await repository.claim("w1", 1, LEASE)).jobs
    assert claimed.lease.job_id == job_id
    await repository.append_event(claimed.lease, "progress", {"done": 1})
    await repository.succeed(claimed.lease)
    return job_id


async def test_an_owners_events_are_numbered_in_commit_order_from_one(repository: JobRepository) -> None:
    first = await run_one(repository)
    second = await enqueue(repository)

    page = await repository.read_feed(OWNER, 0, 100)

    assert [numbered.position for numbered in page.events] == [1, 2, 3, 4, 5]
    assert [(numbered.event.job_id, numbered.event.type) for numbered in page.events] == [
        (first, "job.queued"),
        (first, "job.started"),
        (first, "progress"),
        (first, "job.succeeded"),
        (second, "job.queued"),
    ]
    # The feed carries each job's own log as it is, payloads and all.
    for job_id in (first, second):
        logged = await repository.list_events(OWNER, job_id, 0, 100)
        assert [n.event for n in page.events if n.event.job_id == job_id] == logged
    assert page.events[2].event.payload == {"done": 1}
    assert {numbered.subject.owner_id for numbered in page.events} == {OWNER}
    assert (page.events[0].subject.kind, page.events[0].subject.resource_type) == ("example.echo", "order")
    assert await repository.feed_head(OWNER) == FeedHead(last_position=5, expired_through=0)


async def test_two_owners_feeds_are_counted_apart(repository: JobRepository) -> None:
    await run_one(repository, owner=OTHER)
    await run_one(repository)
    await enqueue(repository, owner_id=OTHER)

    mine = (await repository.read_feed(OWNER, 0, 100)).events
    theirs = (await repository.read_feed(OTHER, 0, 100)).events

    # Neither owner's positions say anything of the other's activity.
    assert [numbered.position for numbered in mine] == [1, 2, 3, 4]
    assert [numbered.position for numbered in theirs] == [1, 2, 3, 4, 5]
    assert {numbered.subject.owner_id for numbered in mine} == {OWNER}
    assert {numbered.subject.owner_id for numbered in theirs} == {OTHER}
    assert (await repository.read_feed("nobody", 0, 100)).events == []
    assert (await repository.feed_head("nobody")).last_position == 0


async def test_a_batch_numbers_its_events_in_request_order(repository: JobRepository) -> None:
    answers = await repository.enqueue_batch(
        [NewJob(owner_id=OWNER, kind="example.echo", payload={"n": n}) for n in range(5)]
    )

    page = await repository.read_feed(OWNER, 0, 100)

    assert [numbered.event.job_id for numbered in page.events] == [job.id for job, _ in answers]
    assert [numbered.position for numbered in page.events] == [1, 2, 3, 4, 5]


async def test_the_feed_replays_then_follows_live_from_any_position(repository: JobRepository) -> None:
    await run_one(repository)
    stream = follow_feed(repository, OWNER, 2, EVERYTHING)

    replayed = await take(stream, 2)
    assert [numbered.position for numbered in replayed] == [3, 4]

    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert not pending.done()
    job_id = await enqueue(repository)
    live = await asyncio.wait_for(pending, SOON)
    assert (live.position, live.event.job_id, live.event.type) == (5, job_id, "job.queued")
    await stream.aclose()


async def test_a_position_none_starts_at_the_oldest_and_tail_at_the_end(repository: JobRepository) -> None:
    await run_one(repository)
    everything = follow_feed(repository, OWNER, None, EVERYTHING)
    tail = follow_feed(repository, OWNER, None, EVERYTHING, tail=True)
    assert [numbered.position for numbered in await take(everything, 4)] == [1, 2, 3, 4]
    tail_next = asyncio.ensure_future(anext(tail))
    await asyncio.sleep(0)

    await enqueue(repository)

    assert (await asyncio.wait_for(tail_next, SOON)).position == 5
    assert (await take(everything, 1))[0].position == 5
    await everything.aclose()
    await tail.aclose()


async def test_filters_pass_only_what_they_name(repository: JobRepository) -> None:
    await run_one(repository, kind="billing.charge")
    await run_one(repository, kind="media.resize")
    await enqueue(repository, kind="media.resize", resource_type="photo", resource_id="p1")

    async def matching(wanted: FeedFilter, count: int) -> list[tuple[str, str]]:
        stream = follow_feed(repository, OWNER, None, wanted)
        got = await take(stream, count)
        await stream.aclose()
        return [(numbered.subject.kind, numbered.event.type) for numbered in got]

    by_kind = await matching(FeedFilter(kinds=frozenset({"media.resize"})), 5)
    assert {kind for kind, _ in by_kind} == {"media.resize"}
    by_type = await matching(FeedFilter(event_types=frozenset({"job.succeeded", "job.queued"})), 5)
    assert [event_type for _, event_type in by_type] == ["job.queued", "job.succeeded"] * 2 + ["job.queued"]
    by_resource = await matching(FeedFilter(resource_type="photo"), 1)
    assert by_resource == [("media.resize", "job.queued")]
    # What a filter passes over still moves the stream on: the next match is live.
    stream = follow_feed(repository, OWNER, None, FeedFilter(kinds=frozenset({"billing.charge"})))
    await take(stream, 4)
    later = asyncio.ensure_future(anext(stream))
    await enqueue(repository, kind="media.resize")
    await enqueue(repository, kind="billing.charge")
    assert (await asyncio.wait_for(later, SOON)).position == 11
    await stream.aclose()


async def test_a_position_past_the_end_is_refused(repository: JobRepository) -> None:
    await enqueue(repository)
    stream = follow_feed(repository, OWNER, 2, EVERYTHING)
    with pytest.raises(InvalidArgument) as refused:
        await anext(stream)
    assert refused.value.field == "after_position"
    # Its own newest position is fine: the stream waits for the next.
    at_end = follow_feed(repository, OWNER, 1, EVERYTHING)
    waiting = asyncio.ensure_future(anext(at_end))
    await enqueue(repository)
    assert (await asyncio.wait_for(waiting, SOON)).position == 2
    await at_end.aclose()


async def test_retention_past_a_position_expires_it_naming_the_oldest_kept(
    repository: JobRepository, clock: ManualClock
) -> None:
    old = await run_one(repository)  # positions 1-4
    clock.advance(3600)
    kept = await enqueue(repository)  # position 5
    assert await repository.delete_expired(clock.now() - timedelta(seconds=60), 100) == 1

    assert (await repository.feed_head(OWNER)).expired_through == 4
    for behind in (0, 3):
        stream = follow_feed(repository, OWNER, behind, EVERYTHING)
        with pytest.raises(FeedPositionExpired) as expired:
            await anext(stream)
        assert expired.value.oldest_position == encode_position(4)
        assert encode_position(4) in str(expired.value)
    # From the mark on, or from the oldest kept, nothing is missing.
    for start in (4, None):
        stream = follow_feed(repository, OWNER, start, EVERYTHING)
        (first,) = await take(stream, 1)
        assert (first.position, first.event.job_id) == (5, kept)
        await stream.aclose()
    assert old not in {
        numbered.event.job_id for numbered in (await repository.read_feed(OWNER, 0, 100)).events
    }


async def test_a_drain_ends_a_waiting_feed(repository: JobRepository) -> None:
    draining = False
    stream = follow_feed(repository, OWNER, None, EVERYTHING, stopping=lambda: draining)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    draining = True
    repository.changes.interrupt_watchers()
    with pytest.raises(ServerDraining):
        await asyncio.wait_for(waiting, SOON)


async def test_a_childs_release_is_numbered_in_its_parents_commit(repository: JobRepository) -> None:
    parent = await enqueue(repository)
    child, _ = await repository.enqueue(
        NewJob(owner_id=OWNER, kind="example.echo", payload={}, depends_on=(parent,))
    )
    (claimed,) = (await repository.claim("w1", 1, LEASE)).jobs
    await repository.succeed(claimed.lease)

    page = await repository.read_feed(OWNER, 0, 100)

    assert [(n.event.job_id, n.event.type) for n in page.events] == [
        (parent, "job.queued"),
        (child.id, "job.queued"),
        (parent, "job.started"),
        (parent, "job.succeeded"),
        (child.id, "job.dependencies_met"),
    ]
    assert [n.position for n in page.events] == [1, 2, 3, 4, 5]

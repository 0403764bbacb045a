"""The owner's feed with two replicas on one PostgreSQL database (DESIGN §17):
a position is never skipped because a slower transaction committed a lower one
later.

The guarantee (server/jobs/operations/feed.py): a unit of work numbers its
events last, under its owners' feed heads (`Rows.advance_feed_heads`, an
UPDATE holding the row lock until COMMIT). A second unit of work of the same
owner on another replica waits on that lock, and takes the next numbers only
once the first has committed; so a reader that sees a position already sees
every lower one.

Made, not hoped for: one replica is held inside its transaction just after it
took its numbers (`Hold` on `SqlRows.advance_feed_heads`), and the test waits
until PostgreSQL reports the other replica's write blocked behind it. Then a
stress run: both replicas write as fast as they can, some of their batches
held open after numbering, while a subscriber on each replica reads.

Mutant checked by hand (a temporary edit of server/, reverted): the heads
moved on in a transaction of their own, committed at once (numbers taken as a
database sequence hands them out, with no lock held to the commit) -> both
tests fail: the other replica never blocks, and in the stress run the
subscribers' sequences differ from what the database holds.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from leasehold._server.jobs.owner_feed import FeedFilter, follow_feed
from leasehold._server.jobs.records import FeedEvent, NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.sql.rows import SqlRows
from tests.conftest import Postgres
from tests.contract.helpers import LEASE
from tests.replicas.holds import SIGNAL_TIMEOUT, Hold, Replicas, blocked_behind
from tests.support import OWNER

pytestmark = pytest.mark.timeout(120)

STRESS_SEED = 17
STRESS_WRITERS = 6  # concurrent writers per replica
STRESS_ROUNDS = 25  # jobs per writer, each: enqueue, claim, two appends, success
HELD_SHARE = 0.2  # of the numbering batches, held open a moment after numbering


def new(owner: str = OWNER) -> NewJob:
    return NewJob(owner_id=owner, kind="example.echo", payload={})


async def collect(stream: AsyncIterator[FeedEvent], count: int) -> list[FeedEvent]:
    got: list[FeedEvent] = []
    async with asyncio.timeout(SIGNAL_TIMEOUT * 3):
        while len(got) < count:
            got.append(await anext(stream))
    return got


def owned_by(owner: str) -> Callable[..., bool]:
    def matches(counts: dict[str, int], *_: Any) -> bool:
        return owner in counts

    return matches


async def test_a_number_taken_and_not_yet_committed_holds_back_the_owners_next(
    replicas: Replicas, postgres: Postgres, hold_after: Callable[[str, Callable[..., bool]], Hold]
) -> None:
    on_a = follow_feed(replicas.a, OWNER, None, FeedFilter())
    on_b = follow_feed(replicas.b, OWNER, None, FeedFilter())
    first_on_a, first_on_b = asyncio.ensure_future(anext(on_a)), asyncio.ensure_future(anext(on_b))
    hold = hold_after("advance_feed_heads", owned_by(OWNER))

    held = asyncio.ensure_future(replicas.a.enqueue(new()))
    await hold.wait_reached()
    later = asyncio.ensure_future(replicas.b.enqueue(new()))
    # B's write for the same owner waits for A's commit, and no subscriber has
    # seen anything yet.
    assert await blocked_behind(postgres, hold.backend_pid, later)
    assert not first_on_a.done() and not first_on_b.done()

    hold.release()
    (first, _), (second, _) = await asyncio.wait_for(asyncio.gather(held, later), SIGNAL_TIMEOUT)

    for stream, first_event in ((on_a, first_on_a), (on_b, first_on_b)):
        seen = [await asyncio.wait_for(first_event, SIGNAL_TIMEOUT), *await collect(stream, 1)]
        assert [(n.position, n.event.job_id) for n in seen] == [(1, first.id), (2, second.id)]
        await stream.aclose()


class RandomHolds:
    """Holds a share of the numbering batches open a moment after they took
    their numbers, on whichever replica's writer thread runs them."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.held = 0
        self.numbered = 0

    def __call__(self, rows: SqlRows, *args: Any) -> None:
        with self._lock:
            self.numbered += 1
            hold = self._random.random() < HELD_SHARE
            pause = self._random.uniform(0.001, 0.01)
            self.held += hold
        if hold:
            time.sleep(pause)  # on the writer thread, inside its open transaction


async def run_jobs(repository: JobRepository, worker: str, rounds: int) -> None:
    """Enqueue, claim, append twice and succeed, `rounds` times, as fast as it goes."""
    for round_ in range(rounds):
        await repository.enqueue(new())
        claimed = (await repository.claim(f"{worker}-{round_}", 1, LEASE)).jobs
        for job in claimed:
            await repository.append_event(job.lease, "progress", {"step": 1})
            await repository.append_event(job.lease, "progress", {"step": 2})
            await repository.succeed(job.lease)


async def test_two_replicas_writing_at_once_reach_both_subscribers_in_one_order_exactly_once(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds = RandomHolds(STRESS_SEED)
    original = SqlRows.advance_feed_heads

    def advance(self: SqlRows, counts: dict[str, int]) -> dict[str, int]:
        moved = original(self, counts)
        holds(self, counts)
        return moved

    monkeypatch.setattr(SqlRows, "advance_feed_heads", advance)
    on_a = follow_feed(replicas.a, OWNER, None, FeedFilter())
    on_b = follow_feed(replicas.b, OWNER, None, FeedFilter())
    reading_a = asyncio.ensure_future(anext(on_a))
    reading_b = asyncio.ensure_future(anext(on_b))

    await asyncio.gather(
        *(
            run_jobs(replica, f"{name}{writer}", STRESS_ROUNDS)
            for name, replica in (("a", replicas.a), ("b", replicas.b))
            for writer in range(STRESS_WRITERS)
        )
    )
    # Claims may take any job: every job ran unless one was left queued; finish those too.
    for leftover in (await replicas.a.claim("sweeper", 1000, LEASE)).jobs:
        await replicas.a.succeed(leftover.lease)
    total = (await replicas.a.feed_head(OWNER)).last_position
    stored = (await replicas.a.read_feed(OWNER, 0, total + 1)).events

    seen_a = [await reading_a, *await collect(on_a, total - 1)]
    seen_b = [await reading_b, *await collect(on_b, total - 1)]
    await on_a.aclose()
    await on_b.aclose()

    expected = [(n.position, n.event.job_id, n.event.sequence) for n in stored]
    assert [n.position for n in stored] == list(range(1, total + 1))
    for seen in (seen_a, seen_b):
        assert [(n.position, n.event.job_id, n.event.sequence) for n in seen] == expected
    # Both replicas numbered, and batches were held open while the other wrote.
    assert total >= STRESS_WRITERS * 2 * STRESS_ROUNDS * 5
    assert holds.held > 10, holds.held

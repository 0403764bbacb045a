"""The claim order and limits of DESIGN §11 on every engine: run_at, priority,
fair share across owners, kind and owner limits, rate limits, retry policies."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import ClaimedJob, JobStatus, NewJob, RetryPolicy
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.steering import Rate, Steering
from tests.conftest import Steered
from tests.contract.helpers import LEASE, claim_one, enqueue
from tests.support import OWNER

ZERO_JITTER = {"jitter": lambda: 0.0}


def job(owner: str = OWNER, kind: str = "example.echo", **fields: object) -> NewJob:
    return NewJob(owner_id=owner, kind=kind, payload={}, **fields)  # type: ignore[arg-type]


async def backlog(repository: JobRepository, count: int, owner: str = OWNER, **fields: object) -> None:
    for start in range(0, count, 1000):
        await repository.enqueue_batch([job(owner, **fields) for _ in range(start, min(count, start + 1000))])


async def claim(repository: JobRepository, limit: int, kinds: KindFilter | None = None) -> list[ClaimedJob]:
    if kinds is None:
        return (await repository.claim("w1", limit, LEASE)).jobs
    return (await repository.claim("w1", limit, LEASE, kinds)).jobs


def owners(claimed: list[ClaimedJob]) -> Counter[str]:
    return Counter(c.job.owner_id for c in claimed)


# ----- run_at ------------------------------------------------------------------------------


async def test_a_job_is_not_claimed_before_its_run_at_and_is_claimed_once_due(
    repository: JobRepository, clock: ManualClock
) -> None:
    run_at = clock.now() + timedelta(seconds=90)
    created, _ = await repository.enqueue(job(run_at=run_at))

    assert (created.run_at, created.available_at) == (run_at, run_at)
    early = await repository.claim("w1", 5, LEASE)
    assert early.jobs == []
    assert early.next_wakeup_at == run_at  # a wake-up for the due time, not a poll
    clock.advance(89.999)
    assert await claim(repository, 5) == []
    clock.advance(0.001)
    (claimed,) = await claim(repository, 5)
    assert claimed.job.id == created.id


async def test_a_past_run_at_means_now(repository: JobRepository, clock: ManualClock) -> None:
    created, _ = await repository.enqueue(job(run_at=clock.now() - timedelta(days=3)))

    assert created.available_at == clock.now()
    assert (await claim_one(repository)).job.id == created.id


# ----- priority ----------------------------------------------------------------------------


async def test_a_priority_1_job_behind_1000_priority_3_jobs_is_claimed_next(
    repository: JobRepository, clock: ManualClock
) -> None:
    await backlog(repository, 1000)
    clock.advance(1)
    urgent, _ = await repository.enqueue(job(priority=1))

    assert (await claim_one(repository)).job.id == urgent.id
    assert (await claim_one(repository)).job.priority == 3


async def test_fairness_applies_within_a_priority_never_across_priorities(
    repository: JobRepository,
) -> None:
    """Owner B has nothing running and A has many, but A's priority-2 jobs
    still all go before B's priority-3 job."""
    await backlog(repository, 5, owner="alice", priority=2)
    late, _ = await repository.enqueue(job(owner="bob", priority=3))

    claimed = await claim(repository, 5)
    assert owners(claimed) == {"alice": 5}
    assert [c.job.id for c in await claim(repository, 5)] == [late.id]


# ----- fair share --------------------------------------------------------------------------


async def test_a_lone_owner_gets_every_slot(repository: JobRepository) -> None:
    await backlog(repository, 30)

    assert len(await claim(repository, 20)) == 20


async def test_an_owner_behind_5000_jobs_of_another_is_among_the_next_claims(
    repository: JobRepository, clock: ManualClock
) -> None:
    await backlog(repository, 5000, owner="alice")
    await claim(repository, 8)  # alice already runs 8
    clock.advance(1)
    starved, _ = await repository.enqueue(job(owner="bob"))

    assert starved.id in [c.job.id for c in await claim(repository, 4)]


async def test_slots_are_dealt_one_at_a_time_to_the_owner_with_the_fewest_running(
    repository: JobRepository,
) -> None:
    for owner in ("alice", "bob", "carol"):
        await backlog(repository, 20, owner=owner)
    assert owners(await claim(repository, 2)) == {"alice": 1, "bob": 1}  # turns go by owner id
    # carol has none running, so she goes first; then each gets one more in turn.
    claimed = await claim(repository, 4)
    assert [c.job.owner_id for c in claimed] == ["carol", "alice", "bob", "carol"]


async def test_spreading_work_over_many_kinds_gains_no_share(repository: JobRepository) -> None:
    """5,000 jobs over 50 kinds and as many resource keys for one owner, 5,000 of
    one kind for the other: the slots split evenly all the same."""
    kinds = [f"spread.k{index}" for index in range(50)]
    for start in range(0, 5000, 1000):
        await repository.enqueue_batch(
            [
                job("spreader", kind=kinds[index % 50], resource_type="r", resource_id=str(index))
                for index in range(start, start + 1000)
            ]
        )
    await backlog(repository, 5000, owner="steady")

    running: list[ClaimedJob] = []
    for _ in range(5):
        running += await claim(repository, 4)
    assert owners(running) == {"spreader": 10, "steady": 10}
    assert len({c.job.kind for c in running if c.job.owner_id == "spreader"}) == 10


async def test_weighted_owners_hold_shares_of_running_slots_within_10_percent(
    steered: Steered, clock: ManualClock
) -> None:
    """Weights 1, 1 and 2, everyone backlogged, 20 slots: as jobs end (the
    oldest first) and slots are refilled, the running shares hold 25/25/50."""
    repository = await steered(steering_rules=Steering(owner_weights={"carol": 2.0}))
    for owner in ("alice", "bob", "carol"):
        await backlog(repository, 400, owner=owner)
    running: list[ClaimedJob] = await claim(repository, 20)
    samples: Counter[str] = Counter()
    for _ in range(40):
        for finished in running[:5]:
            await repository.succeed(finished.lease)
        running = running[5:] + await claim(repository, 5)
        clock.advance(0.1)
        samples.update(owners(running))
    total = sum(samples.values())
    shares = {owner: samples[owner] / total for owner in ("alice", "bob", "carol")}
    assert shares == pytest.approx({"alice": 0.25, "bob": 0.25, "carol": 0.5}, abs=0.025)


# ----- limits ------------------------------------------------------------------------------


async def test_a_kind_limit_holds_back_only_that_kind_and_frees_as_jobs_end(
    steered: Steered, clock: ManualClock
) -> None:
    repository = await steered(steering_rules=Steering(kind_limits={"pdf.render": 2}))
    await repository.enqueue_batch([job(kind="pdf.render") for _ in range(5)])
    clock.advance(1)
    await backlog(repository, 5)

    first = await claim(repository, 10)
    assert Counter(c.job.kind for c in first) == {"pdf.render": 2, "example.echo": 5}
    result = await repository.claim("w1", 10, LEASE)
    assert result.jobs == []
    # The held-back jobs are due, but a wake-up for them would be a busy loop:
    # only the leases' expiry is a moment worth waking for.
    assert result.next_wakeup_at == min(c.lease_expires_at for c in first)
    await repository.succeed(next(c for c in first if c.job.kind == "pdf.render").lease)
    assert [c.job.kind for c in await claim(repository, 10)] == ["pdf.render"]


async def test_a_slot_held_by_a_lost_worker_frees_when_its_lease_lapses(
    steered: Steered, clock: ManualClock
) -> None:
    repository = await steered(steering_rules=Steering(kind_limits={"pdf.render": 1}))
    await repository.enqueue_batch([job(kind="pdf.render") for _ in range(2)])
    (held,) = await claim(repository, 5)  # and its worker dies

    clock.advance(LEASE - 1)
    assert await claim(repository, 5) == []
    clock.advance(1)
    taken = await claim(repository, 5)
    assert len(taken) == 1  # the lapsed one is queued again, behind the other
    assert taken[0].job.id != held.job.id or taken[0].lease.token != held.lease.token


async def test_an_owner_limit_caps_each_owner_and_the_rest_go_to_others(steered: Steered) -> None:
    repository = await steered(steering_rules=Steering(owner_limit=3))
    await backlog(repository, 10, owner="alice")
    await backlog(repository, 10, owner="bob")

    assert owners(await claim(repository, 10)) == {"alice": 3, "bob": 3}
    assert await claim(repository, 10) == []


async def test_a_priority_held_back_by_a_limit_lets_the_next_priority_go(steered: Steered) -> None:
    repository = await steered(steering_rules=Steering(kind_limits={"pdf.render": 1}))
    await repository.enqueue_batch([job(kind="pdf.render", priority=1) for _ in range(3)])
    await backlog(repository, 3, priority=4)

    claimed = await claim(repository, 10)
    assert Counter((c.job.kind, c.job.priority) for c in claimed) == {
        ("pdf.render", 1): 1,
        ("example.echo", 4): 3,
    }


async def test_a_job_ending_under_a_limit_wakes_a_waiting_claim(steered: Steered) -> None:
    """Nothing new was enqueued, but the ended job frees a slot: the claim
    waiting for work must hear of it."""
    repository = await steered(steering_rules=Steering(kind_limits={"pdf.render": 1}))
    await repository.enqueue_batch([job(kind="pdf.render") for _ in range(2)])
    (running,) = await claim(repository, 5)
    waiting = asyncio.ensure_future(
        repository.claim_with_next_work("w2", 5, LEASE, KindFilter(), asyncio.Event(), timeout=10)
    )
    await asyncio.sleep(0.05)
    assert not waiting.done()

    await repository.succeed(running.lease)
    result = await asyncio.wait_for(waiting, 5)
    assert result is not None and len(result.jobs) == 1


async def test_a_rate_starts_at_most_burst_plus_rate_times_elapsed(
    steered: Steered, clock: ManualClock
) -> None:
    repository = await steered(steering_rules=Steering(kind_rates={"example.echo": Rate(10.0, 5)}))
    await backlog(repository, 100)

    first = await repository.claim("w1", 100, LEASE)
    assert len(first.jobs) == 5
    assert first.next_wakeup_at == clock.now() + timedelta(seconds=0.1)  # the next token
    started = 5
    for _ in range(20):
        clock.advance(0.25)
        started += len(await claim(repository, 100))
    # 5 seconds later: the burst and 10 a second, never more.
    assert started == 5 + 50


async def test_a_rate_is_shared_by_every_process_on_the_database(
    steered: Steered, clock: ManualClock
) -> None:
    rules = Steering(kind_rates={"example.echo": Rate(10.0, 5)})
    first = await steered(steering_rules=rules)
    try:
        second = await steered(share=0, steering_rules=rules)
    except AssertionError:
        pytest.skip("the memory engine is one process by nature")
    await backlog(first, 100)

    started = len(await claim(first, 100)) + len(await claim(second, 100))
    assert started == 5
    clock.advance(0.3)  # three more tokens (the burst of 5 caps any longer wait)
    started += len(await claim(second, 100)) + len(await claim(first, 100))
    assert started == 8


# ----- retry policies ------------------------------------------------------------------------

POLICY = RetryPolicy(
    initial_interval_seconds=2.0,
    backoff_coefficient=3.0,
    max_interval_seconds=10.0,
    non_retryable_error_types=("ValueError", "bad%type_"),
)


async def test_a_retry_policy_sets_each_wait_and_caps_it(steered: Steered, clock: ManualClock) -> None:
    repository = await steered(**ZERO_JITTER)
    created, _ = await repository.enqueue(job(max_attempts=5, retry_policy=POLICY))
    assert created.retry_policy == POLICY

    waits = []
    for _ in range(4):
        claimed = await claim_one(repository)
        failed = await repository.fail(claimed.lease, "boom", error_type="KeyError")
        waits.append((failed.available_at - clock.now()).total_seconds())
        clock.advance(waits[-1])
    assert waits == [2.0, 6.0, 10.0, 10.0]


async def test_jitter_only_shortens_a_wait_and_by_at_most_a_fifth(
    steered: Steered, clock: ManualClock
) -> None:
    draw = [0.0]
    repository = await steered(jitter=lambda: draw[0])
    await repository.enqueue(job(max_attempts=5, retry_policy=POLICY))
    waits = []
    for value in (0.0, 0.999999, 0.5):
        claimed = await claim_one(repository)
        draw[0] = value
        failed = await repository.fail(claimed.lease, "boom")
        waits.append((failed.available_at - clock.now()).total_seconds())
        clock.advance(waits[-1])

    assert waits == pytest.approx([2.0, 6.0 * 0.8, 10.0 * 0.9], abs=1e-5)
    assert 6.0 * 0.8 < waits[1] < 6.0


async def test_a_non_retryable_error_type_fails_the_job_at_once(steered: Steered) -> None:
    repository = await steered(**ZERO_JITTER)
    for error_type, status in (
        ("ValueError", JobStatus.FAILED),
        ("bad%type_", JobStatus.FAILED),
        ("badXtypeY", JobStatus.QUEUED),  # LIKE-style wildcards are plain characters
        ("Value", JobStatus.QUEUED),  # a whole name, never a part of one
        ("valueerror", JobStatus.QUEUED),  # and in its own case
        (None, JobStatus.QUEUED),
    ):
        await repository.enqueue(job(max_attempts=5, retry_policy=POLICY))
        claimed = await claim_one(repository)
        ended = await repository.fail(claimed.lease, "boom", error_type=error_type)
        assert (error_type, ended.status) == (error_type, status)
        if ended.status is JobStatus.QUEUED:
            await repository.cancel(OWNER, ended.id)


async def test_without_a_policy_the_default_schedule_stays(steered: Steered, clock: ManualClock) -> None:
    repository = await steered(jitter=lambda: 0.9)
    await enqueue(repository, max_attempts=5)
    claimed = await claim_one(repository)
    failed = await repository.fail(claimed.lease, "boom", error_type="ValueError")

    assert failed.retry_policy is None
    assert failed.available_at - clock.now() == timedelta(seconds=2)


async def test_retry_copies_priority_policy_and_run_at(repository: JobRepository, clock: ManualClock) -> None:
    run_at = clock.now() + timedelta(hours=1)
    source, _ = await repository.enqueue(job(priority=2, retry_policy=POLICY, run_at=run_at))
    await repository.cancel(OWNER, source.id)

    copy = await repository.retry(OWNER, source.id)
    assert (copy.priority, copy.retry_policy, copy.run_at, copy.available_at) == (2, POLICY, run_at, run_at)


# ----- what holds a job back --------------------------------------------------------------------


async def test_occupancy_counts_live_leases_of_the_kind_and_the_owner(
    steered: Steered, clock: ManualClock
) -> None:
    repository = await steered(steering_rules=Steering(kind_rates={"pdf.render": Rate(1.0, 2)}))
    await repository.enqueue_batch([job(kind="pdf.render") for _ in range(3)])
    await repository.enqueue_batch([job(owner="bob") for _ in range(2)])
    await claim(repository, 10)

    mine = await repository.occupancy(OWNER, "pdf.render")
    assert (mine.kind_running, mine.owner_running, mine.rate_tokens) == (2, 2, 0.0)
    bobs = await repository.occupancy("bob", "example.echo")
    assert (bobs.kind_running, bobs.owner_running, bobs.rate_tokens) == (2, 2, None)
    clock.advance(LEASE)  # every lease lapsed: nothing holds a slot
    lapsed = await repository.occupancy(OWNER, "pdf.render")
    assert (lapsed.kind_running, lapsed.owner_running) == (0, 0)
    assert lapsed.rate_tokens == pytest.approx(2.0)

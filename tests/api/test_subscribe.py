"""Subscribe over a real port (DESIGN §17): every event of every job the caller
owns, in commit order, each with its position, kind and resource; resumed from
a position with no gap or duplicate; bad input named; another owner's feed
unseen; an expired position OUT_OF_RANGE naming where to resume."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    WAIT,
    drain,
    enqueue,
    error_info,
    expect_error,
    expect_invalid,
    wait_for_terminal,
)
from tests.support import OWNER, owner_metadata

OTHER = "bob"


def subscribe(stub, owner: str = OWNER, **fields):
    return stub.Subscribe(jobs_pb2.SubscribeRequest(**fields), metadata=owner_metadata(owner))


async def take(call, count: int) -> list[jobs_pb2.SubscribeResponse]:
    got: list[jobs_pb2.SubscribeResponse] = []
    async with asyncio.timeout(WAIT):
        async for response in call:
            got.append(response)
            if len(got) == count:
                break
    return got


async def finished_echo(stub, owner: str = OWNER, resource_id: str = "") -> str:
    fields = {"resource_type": "order", "resource_id": resource_id} if resource_id else {}
    job = (await enqueue(stub, "example.echo", {"text": "hi"}, owner=owner, **fields)).job
    await wait_for_terminal(stub, job.id, owner=owner)
    return job.id


async def test_the_feed_carries_every_event_with_its_position_and_job(stub, app) -> None:
    job_id = await finished_echo(stub, resource_id="o-1")
    call = subscribe(stub)

    got = await take(call, 4)
    call.cancel()

    assert [(r.event.job_id, r.event.sequence, r.event.type) for r in got] == [
        (job_id, 1, "job.queued"),
        (job_id, 2, "job.started"),
        (job_id, 3, "echo"),
        (job_id, 4, "job.succeeded"),
    ]
    assert {(r.kind, r.resource_type, r.resource_id) for r in got} == {("example.echo", "order", "o-1")}
    positions = [r.position for r in got]
    # Opaque, but they sort as strings in feed order.
    assert positions == sorted(positions) and len(set(positions)) == 4


async def test_resuming_from_a_position_continues_with_no_gap_and_no_duplicate(stub, app) -> None:
    first = await finished_echo(stub)
    call = subscribe(stub)
    got = await take(call, 2)
    call.cancel()

    second = await finished_echo(stub)
    resumed = subscribe(stub, after_position=got[-1].position)
    rest = await take(resumed, 6)
    resumed.cancel()

    seen = [(r.event.job_id, r.event.sequence) for r in got + rest]
    assert seen == [(first, n) for n in range(1, 5)] + [(second, n) for n in range(1, 5)]


async def test_live_events_arrive_and_tail_starts_at_the_end(stub, app) -> None:
    await finished_echo(stub)
    tail = subscribe(stub, tail=True)
    everything = subscribe(stub, event_types=["job.succeeded"])
    assert len(await take(everything, 1)) == 1
    # Both streams are open before the next job is enqueued (its events are live).
    job_id = await finished_echo(stub)

    live = await take(tail, 4)
    succeeded = await take(everything, 1)
    tail.cancel()
    everything.cancel()

    assert [(r.event.job_id, r.event.type) for r in live][0] == (job_id, "job.queued")
    assert [(r.event.job_id, r.event.type) for r in succeeded] == [(job_id, "job.succeeded")]


async def test_another_owners_feed_is_never_seen(stub, app) -> None:
    mine = await finished_echo(stub)
    theirs = await finished_echo(stub, owner=OTHER)
    bob = subscribe(stub, owner=OTHER)
    alice = subscribe(stub)

    bobs, alices = await take(bob, 4), await take(alice, 4)
    bob.cancel()
    alice.cancel()

    assert {r.event.job_id for r in bobs} == {theirs}
    assert {r.event.job_id for r in alices} == {mine}
    # Each owner's positions count that owner's events alone.
    assert [r.position for r in bobs] == [r.position for r in alices]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"after_position": "not-a-position"}, "after_position"),
        ({"after_position": "00000000000000zz"}, "after_position"),
        ({"after_position": "0000000000000001", "tail": True}, "after_position"),
        ({"after_position": "00000000000f4240"}, "after_position"),  # past the end
        ({"kinds": ["example.echo", "Not A Kind"]}, "kinds[1]"),
        ({"kinds": [f"k{n}" for n in range(101)]}, "kinds"),
        ({"event_types": ["progress", ""]}, "event_types[1]"),
        ({"event_types": ["x" * 129]}, "event_types[0]"),
        ({"event_types": [f"t{n}" for n in range(101)]}, "event_types"),
        ({"resource_type": "r" * 257}, "resource_type"),
        ({"resource_type": "a\x00b"}, "resource_type"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(stub, app, fields, field) -> None:
    await expect_invalid(drain(subscribe(stub, **fields)), field)


async def test_an_expired_position_is_out_of_range_naming_where_to_resume(stub, app: LeaseholdApp) -> None:
    old = await finished_echo(stub)
    call = subscribe(stub)
    first = (await take(call, 1))[0]
    call.cancel()
    kept = (await enqueue(stub, "test.gate")).job.id
    assert app.repository is not None
    # Retention as the service runs it, with everything finished counted as old.
    deleted = await app.repository.delete_expired(app.clock.now() + timedelta(seconds=1), 100)
    assert deleted == 1

    err = await expect_error(
        drain(subscribe(stub, after_position=first.position)), grpc.StatusCode.OUT_OF_RANGE
    )
    info = error_info(err)
    assert info.reason == "FEED_POSITION_EXPIRED"
    assert info.metadata["oldest_position"] in err.details()
    # Resuming from the position it names (or from the oldest kept) loses nothing kept.
    for fields in ({"after_position": info.metadata["oldest_position"]}, {}):
        resumed = subscribe(stub, **fields)
        (next_event,) = await take(resumed, 1)
        resumed.cancel()
        assert (next_event.event.job_id, next_event.event.type) == (kept, "job.queued")
    assert old != kept

"""`Client.subscribe`'s reconnecting against a scripted Subscribe on a real port.

The real server never repeats a position, never ends a feed cleanly and cannot be
told to break a stream at a given response; this one does each on cue, so every
rule of the client's side is shown: what it resumes after, when it asks for the
end of the feed again, which breaks are bounded by which deadline, and what it
raises at once. tests/client/test_feed.py runs the feed against `leasehold serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from leasehold.client import Client, RetryOptions
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.postgres_cluster import free_port

pytestmark = pytest.mark.timeout(60)

WAIT_SECONDS = 10.0
HOLD = "hold"  # the stream stays open, quiet, until the client leaves it
OPEN_FOR_SECONDS = 0.3
ONE_TRY = RetryOptions(deadline_seconds=0, max_backoff_seconds=0.05)
QUICK = RetryOptions(deadline_seconds=30, max_backoff_seconds=0.05)


def position(n: int) -> str:
    return f"{n:016x}"


@dataclass(frozen=True)
class Act:
    """What one Subscribe call does: send headers first (`opens`), send these
    positions, then end with a status (OK: a clean end) or hold."""

    positions: tuple[int, ...] = ()
    end: grpc.StatusCode | str = HOLD
    opens: bool = False


@dataclass
class ScriptedFeed(jobs_pb2_grpc.JobServiceServicer):  # type: ignore[misc]
    acts: list[Act]
    requests: list[jobs_pb2.SubscribeRequest] = field(default_factory=list)

    async def Subscribe(  # noqa: N802 (the generated servicer's name)
        self, request: jobs_pb2.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.SubscribeResponse]:
        self.requests.append(request)
        act = self.acts.pop(0) if self.acts else Act()
        if act.opens:
            await context.send_initial_metadata(())
            if act.end != HOLD and not act.positions:
                # Headers and the end arriving together look like a refusal to
                # the client (the call is over before it saw them open): a
                # stream that opened stays open a moment before it breaks.
                await asyncio.sleep(OPEN_FOR_SECONDS)
        for n in act.positions:
            event = jobs_pb2.JobEvent(job_id=f"job_{n}", sequence=1, type="job.queued")
            yield jobs_pb2.SubscribeResponse(event=event, position=position(n), kind="k")
        if act.end == HOLD:
            await asyncio.Event().wait()
        elif act.end != grpc.StatusCode.OK:
            assert isinstance(act.end, grpc.StatusCode)
            await context.abort(act.end, f"scripted {act.end.name}")


@contextlib.asynccontextmanager
async def serving(*acts: Act) -> AsyncIterator[tuple[ScriptedFeed, str]]:
    feed = ScriptedFeed(list(acts))
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(feed, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield feed, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def take(client: Client, count: int, **options: object) -> list[str]:
    """The positions of the first `count` responses, then leave the feed."""
    got: list[str] = []
    async with asyncio.timeout(WAIT_SECONDS):
        async with contextlib.aclosing(client.subscribe(**options)) as feed:
            async for response in feed:
                got.append(response.position)
                if len(got) == count:
                    break
    return got


def asked(feed: ScriptedFeed) -> list[tuple[str, bool]]:
    return [(request.after_position, request.tail) for request in feed.requests]


async def test_a_break_resumes_after_the_last_position_yielded_and_never_repeats_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="leasehold.client")
    async with serving(
        Act((1, 2), grpc.StatusCode.UNAVAILABLE),
        Act((1, 2, 3)),  # a server may replay what the client has handed out already
    ) as (feed, target):
        async with Client(target, owner="alice", retry=ONE_TRY) as client:
            got = await take(client, 3, kinds=["k"], event_types=["job.queued"], resource_type="r")

    assert got == [position(1), position(2), position(3)]
    assert asked(feed) == [("", False), (position(2), False)]
    for request in feed.requests:  # the filter goes out unchanged on the reconnect
        assert (list(request.kinds), list(request.event_types), request.resource_type) == (
            ["k"],
            ["job.queued"],
            "r",
        )
    notices = [record.getMessage() for record in caplog.records if record.name == "leasehold.client"]
    assert notices == [f"reconnected to {target}, resuming after position {position(2)}"]


async def test_a_tail_feed_asks_for_the_end_again_until_its_first_event() -> None:
    async with serving(
        Act(opens=True, end=grpc.StatusCode.UNAVAILABLE),
        Act((5,), grpc.StatusCode.INTERNAL),
        Act((6,)),
    ) as (feed, target):
        async with Client(target, owner="alice", retry=QUICK) as client:
            got = await take(client, 2, tail=True)

    assert got == [position(5), position(6)]
    assert asked(feed) == [("", True), ("", True), (position(5), False)]


async def test_a_feed_that_was_answered_rides_through_breaks_past_the_retry_deadline() -> None:
    """One try per call: only the first connect is bounded by it."""
    async with serving(
        Act(opens=True, end=grpc.StatusCode.UNAVAILABLE),
        Act(opens=True, end=grpc.StatusCode.UNAVAILABLE),
        Act(end=grpc.StatusCode.UNAVAILABLE),
        Act((1,)),
    ) as (feed, target):
        async with Client(target, owner="alice", retry=ONE_TRY) as client:
            got = await take(client, 1, after_position=position(0))

    assert got == [position(1)]
    assert len(feed.requests) == 4


async def test_a_clean_end_is_a_break_like_any_other() -> None:
    async with serving(Act((1,), grpc.StatusCode.OK), Act((2,))) as (feed, target):
        async with Client(target, owner="alice", retry=ONE_TRY) as client:
            got = await take(client, 2)

    assert got == [position(1), position(2)]
    assert asked(feed) == [("", False), (position(1), False)]


async def test_a_stream_the_server_cancelled_is_resumed() -> None:
    """A server whose shutdown outran the end it was sending its streams
    cancels them; this side never cancelled, so the feed resumes."""
    async with serving(Act((1,), grpc.StatusCode.CANCELLED), Act((2,))) as (feed, target):
        async with Client(target, owner="alice", retry=ONE_TRY) as client:
            got = await take(client, 2)

    assert got == [position(1), position(2)]
    assert asked(feed) == [("", False), (position(1), False)]


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED],
)
async def test_a_status_no_retry_can_change_raises_at_once(code: grpc.StatusCode) -> None:
    async with serving(Act((1,), code)) as (feed, target):
        async with Client(target, owner="alice", retry=QUICK) as client:
            got: list[str] = []
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async with asyncio.timeout(WAIT_SECONDS):
                    async for response in client.subscribe():
                        got.append(response.position)

    assert raised.value.code() == code
    assert got == [position(1)]
    assert len(feed.requests) == 1


async def test_a_deadline_bounds_each_break_of_a_feed_that_was_answered() -> None:
    async with serving(Act((1,), grpc.StatusCode.UNAVAILABLE)) as (feed, target):
        feed.acts.extend(Act(end=grpc.StatusCode.UNAVAILABLE) for _ in range(1000))
        async with Client(target, owner="alice", retry=QUICK) as client:
            got: list[str] = []
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async with asyncio.timeout(WAIT_SECONDS):
                    async for response in client.subscribe(deadline_seconds=0.3):
                        got.append(response.position)

    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert got == [position(1)]
    assert len(feed.requests) >= 2  # it did reconnect before giving up


@dataclass(frozen=True)
class CountedRetry(RetryOptions):
    slept: list[float] = field(default_factory=list)

    def backoffs(self) -> Iterator[float]:
        for backoff in super().backoffs():
            self.slept.append(backoff)
            yield backoff


async def test_an_address_with_nothing_behind_it_fails_within_the_retry_deadline() -> None:
    retry = CountedRetry(deadline_seconds=0.3, max_backoff_seconds=0.05)
    async with Client(f"127.0.0.1:{free_port()}", owner="alice", retry=retry) as client:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async with asyncio.timeout(WAIT_SECONDS):
                async for _ in client.subscribe(tail=True):
                    pass

    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(retry.slept) >= 2  # retried, as a read is, before giving up

"""The owner's feed that survives the server: a broken stream (the server was
killed, a proxy dropped it) or a drain (the server ends open streams UNAVAILABLE)
is reopened after the position of the last response handed to the caller, so the
caller sees every event once, in commit order, whichever server answers next.

There is no Get to prove the service is there first, as `watch` has: a feed
names no job to read. So the feed itself tells the two kinds of break apart.
Until the service has answered it (opened the stream, or sent a response), a
break may be an address with nothing behind it, and is retried like a read,
within the client's retry deadline. Once it has answered, a break is a restart
or a drain of a service that exists, waited out for as long as the caller
iterates, unless the caller gave the feed a deadline of its own. A service that
sends its headers only with its first response (as grpc's Python server does
unless told otherwise) leaves a quiet feed, such as a fresh tail, unanswered until
its first event; a break before then is bounded like reaching the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from leasehold.client._reconnect import RESUMABLE, Outage, logger
from leasehold.client._retry import READ_RETRYABLE
from leasehold.client._session import Session
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

# DEADLINE_EXCEEDED too: the feed sets no deadline on its stream, so only something
# between the client and the service can have ended it so, and reads are retried
# after it anyway.
FEED_RESUMABLE = RESUMABLE | READ_RETRYABLE


@dataclass(frozen=True)
class FeedFilter:
    """What the caller subscribed to, sent again unchanged on every reconnect."""

    kinds: tuple[str, ...] = ()
    resource_type: str = ""
    event_types: tuple[str, ...] = ()


class _Subscription:
    """Where one subscription stands across its reconnects: the position to
    resume after, whether to ask for the end of the feed again, whether the
    service has answered yet, and the break (if any) being waited out."""

    def __init__(
        self, session: Session, after_position: str, tail: bool, deadline_seconds: float | None
    ) -> None:
        self.session = session
        self.last = after_position
        self.tail = tail
        self.deadline_seconds = deadline_seconds
        self.answered = False
        self.outage: Outage | None = None
        self._clean_end_backoffs = session.retry.backoffs()

    def request(self, wanted: FeedFilter) -> jobs_pb2.SubscribeRequest:
        # A tail stream that broke before its first event asks for the end again:
        # there is no position to resume after, and the oldest kept event would
        # replay history the caller asked not to see.
        return jobs_pb2.SubscribeRequest(
            after_position=self.last,
            kinds=wanted.kinds,
            resource_type=wanted.resource_type,
            event_types=wanted.event_types,
            tail=self.tail,
        )

    def opened(self) -> None:
        """The service has answered: from now on a break is an outage of a
        service that exists, and the one that just ended (if any) is over. Only
        the end of such an outage is told, as watch tells it: retries of the
        first connect are a call's retries, which no call logs."""
        if self.outage is not None and self.answered:
            logger.info("reconnected to %s, %s", self.session.target, self._resuming())
        self.answered = True
        self.outage = None

    def _resuming(self) -> str:
        if self.last:
            return f"resuming after position {self.last}"
        if self.tail:
            return "following from the end of the feed again"
        return "resuming from the oldest kept event"

    def is_new(self, response: jobs_pb2.SubscribeResponse) -> bool:
        """Positions of one owner sort as strings in feed order: one at or
        before the last handed out was handed out already."""
        if response.position <= self.last:
            return False
        self.last = response.position
        self.tail = False  # resume from this position, never from the end again
        return True

    async def may_retry(self, error: grpc.aio.AioRpcError) -> bool:
        """Back off after a break; False when the error must be raised instead."""
        if error.code() not in FEED_RESUMABLE:
            return False
        if self.outage is None:
            # Reaching the service is bounded like any read, from the first failed
            # try (a quiet stream that stood open for an hour gets the whole
            # deadline); a service that has answered is waited for until the
            # feed's own deadline, if any.
            bound = self.deadline_seconds if self.answered else self.session.retry.deadline_seconds
            self.outage = Outage(self.session, bound)
        return await self.outage.wait_to_retry()

    async def wait_after_clean_end(self) -> None:
        """The stream ended OK, which the feed never does by itself (something
        between the client and the service may). Whatever ended it answered, so
        there is nothing to give up on: connect again, after a backoff that
        keeps a stream ended at once from turning into a busy loop."""
        self.answered = True
        await asyncio.sleep(next(self._clean_end_backoffs))


async def subscribe(
    session: Session,
    wanted: FeedFilter,
    after_position: str,
    tail: bool,
    deadline_seconds: float | None,
) -> AsyncIterator[jobs_pb2.SubscribeResponse]:
    stub = jobs_pb2_grpc.JobServiceStub(session.channel)
    subscription = _Subscription(session, after_position, tail, deadline_seconds)
    while True:
        call = stub.Subscribe(subscription.request(wanted), metadata=session.metadata)
        try:
            # Headers alone prove the stream open (a refusal ends the call with
            # them), so a quiet feed counts as answered as soon as a server sends
            # them; one that sends them only with its first response is answered then.
            await call.initial_metadata()
            if not call.done():
                subscription.opened()
            async for response in call:
                subscription.opened()
                if subscription.is_new(response):
                    yield response
        except grpc.aio.AioRpcError as error:
            if not await subscription.may_retry(error):
                raise
            continue
        finally:
            call.cancel()
        await subscription.wait_after_clean_end()


def feed_filter(kinds: Sequence[str], resource_type: str, event_types: Sequence[str]) -> FeedFilter:
    """Taken once: an iterator given as a filter would be empty by the first reconnect."""
    return FeedFilter(kinds=tuple(kinds), resource_type=resource_type, event_types=tuple(event_types))

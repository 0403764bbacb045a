"""What the feed stream sends when Subscribe ends, for the endings a test
server does not readily give (a position retention dropped, a drain), and
that its Subscribe call is cancelled however the stream ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from leasehold._server.dashboard.feed import feed_events
from leasehold.v1 import jobs_pb2

RETRY = "retry: 2000\n\n"


class FakeCall:
    """A Subscribe call that sends nothing, then ends with `code` (or never
    ends, for None); records the request it was opened with and its cancel."""

    def __init__(self, code: grpc.StatusCode | None) -> None:
        self.code = code
        self.request: jobs_pb2.SubscribeRequest | None = None
        self.cancelled = False
        self.opened = asyncio.Event()

    def open(self, request: jobs_pb2.SubscribeRequest) -> FakeCall:
        self.request = request
        self.opened.set()
        return self

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __aiter__(self) -> AsyncIterator[jobs_pb2.SubscribeResponse]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[jobs_pb2.SubscribeResponse]:
        if self.code is None:
            await asyncio.Event().wait()
        metadata = grpc.aio.Metadata()
        raise grpc.aio.AioRpcError(self.code, metadata, metadata, details="from the fake")
        yield jobs_pb2.SubscribeResponse()  # pragma: no cover  # an async generator


def request_with(last_event_id: str | None) -> Request:
    headers = [] if last_event_id is None else [(b"last-event-id", last_event_id.encode())]
    return Request({"type": "http", "method": "GET", "path": "/feed/events", "headers": headers})


async def sent(last_event_id: str | None, call: FakeCall) -> str:
    response = feed_events(request_with(last_event_id), call.open)
    assert isinstance(response, StreamingResponse)
    return "".join([str(chunk) async for chunk in response.body_iterator])


@pytest.mark.parametrize(
    ("last_event_id", "code", "after_retry"),
    [
        # Retention dropped what followed the page's last row: start over.
        (
            "00000000000000a1",
            grpc.StatusCode.OUT_OF_RANGE,
            'event: restart\ndata: {"code": "OUT_OF_RANGE"}\n\n',
        ),
        (
            "00000000000000a1",
            grpc.StatusCode.INVALID_ARGUMENT,
            'event: restart\ndata: {"code": "INVALID_ARGUMENT"}\n\n',
        ),
        # A fresh stream has nothing to start over from: starting over would loop.
        (None, grpc.StatusCode.INVALID_ARGUMENT, 'event: failure\ndata: {"code": "INVALID_ARGUMENT"}\n\n'),
        (
            None,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            'event: failure\ndata: {"code": "RESOURCE_EXHAUSTED"}\n\n',
        ),
        # A drain: the stream just ends, and the browser reconnects after its last event.
        ("00000000000000a1", grpc.StatusCode.UNAVAILABLE, ""),
        (None, grpc.StatusCode.UNAVAILABLE, ""),
    ],
)
async def test_how_a_subscribe_ending_reaches_the_page(
    last_event_id: str | None, code: grpc.StatusCode, after_retry: str
) -> None:
    call = FakeCall(code)
    assert await asyncio.wait_for(sent(last_event_id, call), 10) == RETRY + after_retry
    assert call.cancelled
    expected = (
        jobs_pb2.SubscribeRequest(tail=True)
        if last_event_id is None
        else jobs_pb2.SubscribeRequest(after_position=last_event_id)
    )
    assert call.request == expected


async def test_a_reader_going_away_cancels_the_call() -> None:
    call = FakeCall(None)  # a quiet feed: nothing to send for as long as it is open
    response = feed_events(request_with(None), call.open)
    assert isinstance(response, StreamingResponse)
    stream = response.body_iterator
    assert await anext(stream) == RETRY
    reading = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(call.opened.wait(), 10)
    reading.cancel()  # what Starlette does when the browser disconnects
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert call.cancelled

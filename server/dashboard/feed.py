"""The owner's feed as server-sent events, fed by JobService.Subscribe: the
overview's "Recent events".

Each message's id is the event's feed position, so when the connection drops
the browser's EventSource reconnects with it as Last-Event-ID and the stream
goes on after exactly that event (Subscribe's `after_position`): no gap, no
duplicate. A fresh page has no position and starts at the feed's end (`tail`):
the list shows what happens while it is open. Until its first event a page has
no position to resume from, so a reconnect before then starts at the end again.

The browser holds the position, not this process: the stream is one Subscribe
call, cancelled when the browser goes away (Starlette cancels the response when
it sees the disconnect), and simply ended when the service drains (UNAVAILABLE)
so that the browser resumes on its own, here once the service is back.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from urllib.parse import quote

import grpc
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from leasehold._server.dashboard.events import HEADERS, sse_message
from leasehold._server.dashboard.gateway import FeedCall
from leasehold._server.dashboard.templates import timestamp
from leasehold.v1 import jobs_pb2

# A position is opaque, and the service judges it; this only keeps out what
# was never one of ours (a browser sends back the id it was given): nothing
# that could break an event stream's lines, nothing of unbounded length.
_POSITION = re.compile(r"[0-9A-Za-z._~+/=-]{1,128}")

# What a resume point the service no longer takes gets: the list starts over
# from the feed's end. OUT_OF_RANGE is FEED_POSITION_EXPIRED (retention dropped
# the events after it); INVALID_ARGUMENT can only name `after_position` in the
# request this module sends (past the end: say, the database was replaced).
_START_OVER = (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT)


def _start(request: Request) -> jobs_pb2.SubscribeRequest | None:
    """Where the stream starts: after the browser's Last-Event-ID, or (a fresh
    page) at the end of the feed. None when the header is not a position."""
    after = request.headers.get("last-event-id", "")
    if not after:
        return jobs_pb2.SubscribeRequest(tail=True)
    if not _POSITION.fullmatch(after):
        return None
    return jobs_pb2.SubscribeRequest(after_position=after)


# Opens the Subscribe call with the signed-in owner's credential.
OpenFeed = Callable[[jobs_pb2.SubscribeRequest], FeedCall]


def feed_events(request: Request, open_feed: OpenFeed) -> Response:
    """A bad Last-Event-ID is a 400 before any of the stream is sent."""
    subscribe = _start(request)
    if subscribe is None:
        return PlainTextResponse("Last-Event-ID must be a feed position\n", status_code=400)
    return StreamingResponse(
        _stream(request, open_feed, subscribe), media_type="text/event-stream", headers=HEADERS
    )


async def _stream(
    request: Request, open_feed: OpenFeed, subscribe: jobs_pb2.SubscribeRequest
) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    # Opened here, not by the route: a response cancelled before its first
    # message would otherwise leave a call open that nothing reads or cancels.
    call = open_feed(subscribe)
    try:
        async for response in call:
            if not _POSITION.fullmatch(response.position):  # as an id, it would break the stream's lines
                yield sse_message("failure", json.dumps({"code": "BAD_POSITION"}))
                return
            yield sse_message("feed", _feed_json(request, response), event_id=response.position)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return  # a drain or restart: the browser reconnects after its last event
        if subscribe.after_position and code in _START_OVER:
            # Only a resumed stream: a fresh one starting over would only loop.
            yield sse_message("restart", json.dumps({"code": code.name}))
            return
        yield sse_message("failure", json.dumps({"code": code.name}))
    finally:
        call.cancel()  # the browser went away, or the stream ended: never left open


def _feed_json(request: Request, response: jobs_pb2.SubscribeResponse) -> str:
    event = response.event
    resource = f"{response.resource_type}/{response.resource_id}" if response.resource_type else ""
    return json.dumps(
        {
            "position": response.position,
            "created_at": timestamp(event.created_at),
            "type": event.type,
            "kind": response.kind,
            "job_id": event.job_id,
            "job_url": str(request.url_for("job", job_id=quote(event.job_id, safe=""))),
            "resource": resource,
        }
    )

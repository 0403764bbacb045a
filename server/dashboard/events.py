"""A job's live event stream as server-sent events, fed by WatchEvents through
`Client.watch` (which resumes by itself after a broken stream). The browser's
EventSource resumes too: each message carries the event's sequence as its id,
and a reconnect's Last-Event-ID starts after it."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import grpc
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from leasehold._server.dashboard.actions import job_actions
from leasehold._server.dashboard.graph import waiting_for
from leasehold._server.dashboard.stats import status_name
from leasehold._server.dashboard.templates import timestamp
from leasehold.client import Client, to_dict
from leasehold.v1 import jobs_pb2

# The proxy-friendly headers of an event stream: never cached or buffered.
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


# A sequence as WatchEvents takes it: ASCII digits (str.isdigit also takes "²"),
# and no more than an int64 holds.
_SEQUENCE = re.compile(r"[0-9]{1,19}")
_MAX_SEQUENCE = 2**63 - 1


def _after(request: Request) -> int | None:
    """Where a (re)connecting stream starts, or None when what the browser or
    the URL says is not a sequence number."""
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not _SEQUENCE.fullmatch(text) or int(text) > _MAX_SEQUENCE:
        return None
    return int(text)


async def job_events(request: Request, client: Client, job_id: str) -> Response:
    """Checks the resume point and that the job is the caller's first (NOT_FOUND
    otherwise, as a page), then streams: a bad resume point is a 400 before any
    of the stream is sent, never an error half-way through it."""
    after = _after(request)
    if after is None:
        return PlainTextResponse(
            "Last-Event-ID and after must be an event sequence number (0 to 2^63-1)\n", status_code=400
        )
    await client.get(job_id)
    return StreamingResponse(_stream(client, job_id, after), media_type="text/event-stream", headers=HEADERS)


async def _stream(client: Client, job_id: str, after: int) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    try:
        async for event in client.watch(job_id, after_sequence=after):
            yield sse_message("job", _event_json(event), event_id=str(event.sequence))
            if event.type.startswith("job."):
                yield sse_message("status", _status_json(await client.get(job_id)))
    except grpc.aio.AioRpcError as exc:
        yield sse_message("failure", json.dumps({"code": exc.code().name}))
        return
    yield sse_message("end", "{}")


def sse_message(kind: str, data: str, event_id: str = "") -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {data}\n\n"


def _event_json(event: jobs_pb2.JobEvent) -> str:
    return json.dumps(
        {
            "sequence": event.sequence,
            "type": event.type,
            "payload": to_dict(event.payload),
            "created_at": timestamp(event.created_at),
        }
    )


def _status_json(job: jobs_pb2.Job) -> str:
    error = f"{job.error_type}: {job.error_message}" if job.error_message else ""
    return json.dumps(
        {
            "status": status_name(job.status),
            "attempt": f"{job.attempt}/{job.max_attempts}",
            "error": error,
            # The actions the new status allows: the page drops the others.
            "actions": job_actions(job).names(),
            # So "waiting for 2 parents" counts down as parents end.
            "waiting": waiting_for(job),
        }
    )

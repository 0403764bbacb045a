"""A job's live event stream as server-sent events, fed by WatchEvents through
`Client.watch` (which resumes by itself after a broken stream). The browser's
EventSource resumes too: each message carries the event's sequence as its id,
and a reconnect's Last-Event-ID starts after it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from leasehold._server.dashboard.actions import job_actions
from leasehold._server.dashboard.stats import status_name
from leasehold._server.dashboard.templates import timestamp
from leasehold.client import Client
from leasehold.v1 import jobs_pb2

# The proxy-friendly headers of an event stream: never cached or buffered.
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def _after(request: Request) -> int:
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    return int(text) if text.isdigit() else 0


async def job_events(request: Request, client: Client, job_id: str) -> Response:
    """Checks the job is the caller's first (NOT_FOUND otherwise, as a page),
    then streams."""
    await client.get(job_id)
    return StreamingResponse(
        _stream(client, job_id, _after(request)), media_type="text/event-stream", headers=HEADERS
    )


async def _stream(client: Client, job_id: str, after: int) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    try:
        async for event in client.watch(job_id, after_sequence=after):
            yield _message("job", _event_json(event), event_id=str(event.sequence))
            if event.type.startswith("job."):
                yield _message("status", _status_json(await client.get(job_id)))
    except grpc.aio.AioRpcError as exc:
        yield _message("failure", json.dumps({"code": exc.code().name}))
        return
    yield _message("end", "{}")


def _message(kind: str, data: str, event_id: str = "") -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {data}\n\n"


def _event_json(event: jobs_pb2.JobEvent) -> str:
    return json.dumps(
        {
            "sequence": event.sequence,
            "type": event.type,
            "payload": json_format.MessageToDict(event.payload),
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
        }
    )

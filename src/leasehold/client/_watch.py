"""A job's event stream that survives the server: a broken stream (the server was
killed, a proxy dropped it) or a drain (the server ends open streams UNAVAILABLE)
is reopened from the last sequence handed to the caller, so the caller sees every
event exactly once, in order, whichever server answers next.

Reaching the service at all and getting it back are bounded differently. Before
the watch starts, a Get is retried like any read, within the client's retry
deadline: an address with nothing behind it, or a job that is not the caller's,
fails as any call would. Once the service has answered, a break is a restart or
a drain of a service that exists, and the watch reconnects for as long as the job
runs, unless the caller gave it a deadline of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from leasehold.client._retry import Deadline, sleep_or_give_up
from leasehold.client._session import Session
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL_EVENT_TYPES = frozenset({"job.succeeded", "job.failed", "job.cancelled"})

# A stream cut by a dying server surfaces as UNAVAILABLE; some proxies and a reset
# HTTP/2 stream report INTERNAL or UNKNOWN instead. Only these mean "try again":
# NOT_FOUND, PERMISSION_DENIED and the like end the watch at once. The status code
# decides, never the message: what a draining server says is for operators of
# several replicas, not a reason to stop.
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})

logger = logging.getLogger("leasehold.client")


class _Outage:
    """One break of the stream, until events flow again: how long reconnecting
    may go on, and the backoff between its tries (capped, jittered)."""

    def __init__(self, session: Session, deadline_seconds: float | None) -> None:
        self.deadline = None if deadline_seconds is None else Deadline(deadline_seconds)
        self.backoffs = session.retry.backoffs()

    async def wait_to_retry(self) -> bool:
        """Back off before the next try; False when the watch's deadline has passed."""
        backoff = next(self.backoffs)
        if self.deadline is None:
            await asyncio.sleep(backoff)
            return True
        return await sleep_or_give_up(backoff, self.deadline)


async def watch_events(
    session: Session, job_id: str, after_sequence: int, deadline_seconds: float | None
) -> AsyncIterator[jobs_pb2.JobEvent]:
    stub = jobs_pb2_grpc.JobServiceStub(session.channel)
    # Bounded by the client's retry deadline; once it has answered, a break below
    # is a service restarting, waited out until the watch's own deadline.
    await session.read(stub.Get, jobs_pb2.GetRequest(job_id=job_id))
    last = after_sequence
    outage: _Outage | None = None
    while True:
        call = stub.WatchEvents(
            jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=last), metadata=session.metadata
        )
        try:
            async for response in call:
                event = response.event
                if outage is not None:
                    logger.info("reconnected to %s, resuming after event %d", session.target, last)
                    outage = None
                if event.sequence <= last:
                    continue  # never hand the caller an event twice
                last = event.sequence
                yield event
                if event.type in TERMINAL_EVENT_TYPES:
                    return
        except grpc.aio.AioRpcError as error:
            if error.code() not in RESUMABLE:
                raise
            outage = outage or _Outage(session, deadline_seconds)
            if not await outage.wait_to_retry():
                raise
            continue
        finally:
            call.cancel()
        return  # the server ended the stream cleanly: the job had already finished

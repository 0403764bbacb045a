"""What the client's long-lived streams (`watch`, `subscribe`) share about a break:
which statuses mean "connect again", how long and how often to try, and the one
logger that says when events flow again."""

from __future__ import annotations

import asyncio
import logging

import grpc

from leasehold.client._retry import Deadline, sleep_or_give_up
from leasehold.client._session import Session

# A stream cut by a dying server surfaces as UNAVAILABLE; some proxies and a reset
# HTTP/2 stream report INTERNAL or UNKNOWN instead, and a server whose shutdown
# outran the end it was sending its streams cancels them (CANCELLED: never this
# side's own cancel, which grpc.aio raises as asyncio.CancelledError). Only these
# mean "try again": NOT_FOUND, PERMISSION_DENIED and the like end the stream at
# once. The status code decides, never the message: what a draining server says
# is for operators of several replicas, not a reason to stop.
RESUMABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)

logger = logging.getLogger("leasehold.client")


class Outage:
    """One break of the stream, until events flow again: how long reconnecting
    may go on, and the backoff between its tries (capped, jittered)."""

    def __init__(self, session: Session, deadline_seconds: float | None) -> None:
        self.deadline = None if deadline_seconds is None else Deadline(deadline_seconds)
        self.backoffs = session.retry.backoffs()

    async def wait_to_retry(self) -> bool:
        """Back off before the next try; False when the stream's deadline has passed."""
        backoff = next(self.backoffs)
        if self.deadline is None:
            await asyncio.sleep(backoff)
            return True
        return await sleep_or_give_up(backoff, self.deadline)

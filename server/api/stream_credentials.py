"""Open streams end when their credential does.

A stream is admitted once, at its start, but may stay open as long as its job
runs. Without this, a token removed from the token file (SIGHUP) or a JWT past
its `exp` would go on receiving events for as long as the stream lasted. So
every open stream is registered with how to check its credential again: a
reload re-checks them all at once, and a credential that expires (a JWT's
`exp` plus the leeway) is ended by a timer at that moment. An ended stream
fails UNAUTHENTICATED; a client resumes it with a fresh credential from the
last event it received, so nothing is lost.

Ending a stream cancels the task serving it: a stream waiting for its next
event has nothing else to wake it. The wrapper that catches the cancellation
(method_handlers) asks `revoked()` whether it was this, and answers with the
refusal instead of a cancelled call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import structlog

from leasehold._server.auth.identity import Identity, Role, Unauthenticated, refusal

log = structlog.get_logger("leasehold.api")

# Checks the stream's credential again: raises Unauthenticated once it is no good.
Recheck = Callable[[], Identity]


@dataclass(eq=False)
class GuardedStream:
    recheck: Recheck
    task: asyncio.Task[object]
    refusal: Unauthenticated | None = None
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)

    def end(self, refusal: Unauthenticated) -> None:
        if self.refusal is None:
            self.refusal = refusal
            self.task.cancel()


class StreamCredentials:
    """The open streams of one server, across its services."""

    def __init__(self) -> None:
        self._open: set[GuardedStream] = set()

    @property
    def open(self) -> int:
        return len(self._open)

    @contextlib.contextmanager
    def guarded(self, identity: Identity, wanted: Role, recheck: Recheck) -> Iterator[GuardedStream]:
        """Around one stream, inside the task that serves it. `wanted`: the
        role the service needs, which words the refusal."""
        task = asyncio.current_task()
        assert task is not None, "a stream is served by a task"
        stream = GuardedStream(recheck, task)
        if identity.expires_at is not None:
            expired = refusal(
                wanted, "the credential expired while the stream was open: resume with a new one"
            )
            delay = max(0.0, identity.expires_at - time.time())
            stream.expiry = asyncio.get_running_loop().call_later(delay, stream.end, expired)
        self._open.add(stream)
        try:
            yield stream
        finally:
            self._open.discard(stream)
            if stream.expiry is not None:
                stream.expiry.cancel()

    def recheck_all(self) -> int:
        """After the credentials were reloaded: ends every stream whose
        credential no longer passes; returns how many it ended."""
        ended = 0
        for stream in list(self._open):
            try:
                stream.recheck()
            except Unauthenticated as refused:
                stream.end(refused)
                ended += 1
        if ended:
            log.info("auth.streams_ended", reason="credential no longer accepted", streams=ended)
        return ended

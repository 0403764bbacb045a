"""Which handler serves which job kind."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from leasehold._server.jobs import limits
from leasehold._server.jobs.records import JsonObject

if TYPE_CHECKING:
    from leasehold._server.runtime.context import JobContext, SyncJobContext

# A handler returns None, or a JSON object: the job's result.
AsyncHandler = Callable[["JobContext"], Awaitable[JsonObject | None]]
# A plain function: it runs in a worker thread, so it may compute without awaiting.
SyncHandler = Callable[["SyncJobContext"], JsonObject | None]
Handler = AsyncHandler | SyncHandler


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._sync: set[str] = set()

    def register(self, kind: str, handler: Handler) -> None:
        """Serve `kind` with `handler`: an `async def handler(ctx)`, or a plain
        `def handler(ctx)`, which runs in a worker thread with a `SyncJobContext`.
        A kind is served by exactly one handler: registering it twice is a wiring
        mistake, so it raises ValueError, as does anything that is neither."""
        if not limits.is_valid_kind(kind):
            raise ValueError(f"invalid job kind {kind!r}: use 1-128 characters of [a-z0-9._-]")
        if kind in self._handlers:
            raise ValueError(f"job kind {kind!r} is already registered")
        self._handlers[kind] = handler
        if not _is_async(handler, kind):
            self._sync.add(kind)

    def handler(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def is_sync(self, kind: str) -> bool:
        """Whether `kind`'s handler is a plain function (run in a thread)."""
        return kind in self._sync

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def kinds(self) -> frozenset[str]:
        return frozenset(self._handlers)


def _is_async(handler: object, kind: str) -> bool:
    """True for a coroutine function (also behind functools.partial), False for a
    plain function or callable object; ValueError for anything else: not callable,
    a class, or a generator function, whose call would not run the job."""
    if inspect.iscoroutinefunction(handler):
        return True
    if callable(handler) and not inspect.isclass(handler):
        # An object whose __call__ is an async def.
        if inspect.iscoroutinefunction(type(handler).__call__):
            return True
    bad = (
        not callable(handler)
        or inspect.isclass(handler)
        or inspect.isgeneratorfunction(handler)
        or inspect.isasyncgenfunction(handler)
    )
    if bad:
        raise ValueError(
            f"the handler for job kind {kind!r} must be an async def handler(ctx) "
            f"or a plain def handler(ctx), not {handler!r}"
        )
    return False

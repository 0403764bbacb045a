"""Which handler serves which job kind."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from leasehold._server.jobs import limits
from leasehold._server.jobs.records import JsonObject

if TYPE_CHECKING:
    from leasehold._server.runtime.context import JobContext

# A handler returns None, or a JSON object: the job's result.
Handler = Callable[["JobContext"], Awaitable[JsonObject | None]]


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, kind: str, handler: Handler) -> None:
        """Serve `kind` with `handler`. A kind is served by exactly one handler:
        registering it twice is a wiring mistake, so it raises ValueError."""
        if not limits.is_valid_kind(kind):
            raise ValueError(f"invalid job kind {kind!r}: use 1-128 characters of [a-z0-9._-]")
        if kind in self._handlers:
            raise ValueError(f"job kind {kind!r} is already registered")
        self._handlers[kind] = handler

    def handler(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def kinds(self) -> frozenset[str]:
        return frozenset(self._handlers)

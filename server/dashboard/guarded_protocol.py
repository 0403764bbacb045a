"""uvicorn's h11 protocol with the two bounds it lacks: a deadline for a
request's headers and a cap on open connections.

uvicorn times a connection out only between requests (`timeout_keep_alive`,
armed once a response is sent): a connection that sends nothing, or sends its
headers a byte at a time, is held for ever, and each one is a descriptor. Here a
timer starts when the connection opens (and again whenever a new request
begins) and is cancelled once h11 has the request's headers; a request still
incomplete when it fires gets its connection closed. Above the cap, a new
connection is closed as soon as it is accepted, before it costs anything more.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from leasehold._server.connections import RateLimitedRecords

# What uvicorn logs once per offending request (a malformed one, or one past
# limit_concurrency should that be set); a client repeating them must not be able
# to fill the log.
NOISY_MESSAGES = ("Invalid HTTP request received.", "Exceeded concurrency limit.")


class GuardedH11Protocol(H11Protocol):
    """Set `header_timeout_seconds` and `max_connections` on a subclass
    (`guarded_protocol`): uvicorn builds its protocols itself, from the class."""

    header_timeout_seconds: float = 10.0
    max_connections: int = 1_000

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.connections) >= self.max_connections:
            self._refused = True
            self.transport = transport  # type: ignore[assignment]
            transport.abort()  # type: ignore[attr-defined]  # closed at once: nothing to flush, nothing to wait for
            return
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._refused:
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # h11 leaves IDLE once a request's headers are complete, and returns to
        # it when the next request on this connection may begin.
        if self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
        else:
            self._cancel_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_seconds, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(header_timeout_seconds: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class to pass as uvicorn's `http=`."""
    quiet_uvicorn_repeats()
    return type(
        "DashboardH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout_seconds": header_timeout_seconds, "max_connections": max_connections},
    )


_quieted: list[RateLimitedRecords] = []


def quiet_uvicorn_repeats() -> None:
    """Once per process: uvicorn's per-request warnings at most once per interval."""
    if not _quieted:
        records = RateLimitedRecords(NOISY_MESSAGES)
        logging.getLogger("uvicorn.error").addFilter(records)
        _quieted.append(records)

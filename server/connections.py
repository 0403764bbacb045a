"""How many connections `serve` holds open, for how long, and what happens when
the process runs out of file descriptors.

Every open connection is a descriptor, and descriptors are shared with what the
service needs to answer at all: database connections, the dashboard's channel to
the API, log and handler files. A listener that lets anyone hold connections open
for free (no bytes sent, or an HTTP/2 preface and nothing more) hands the whole
process to whoever opens the most. So each listener has three bounds:

- a handshake timeout: a connection must finish its HTTP/2 handshake (gRPC) or
  send a request's headers (dashboard, metrics) within it, or it is closed;
- an idle timeout: a gRPC connection with no call open is closed after it (a
  connection carrying a WatchEvents stream or a long-poll Claim is not idle);
- a connection cap: above it, new connections are closed as soon as they are
  accepted, while the connections already open are served as before.

The caps are derived from the descriptor limit `serve` gets (it raises its soft
limit to the hard one at start): what is left after a reserve for the database
pool and the rest is split, three quarters for gRPC, one quarter for the
dashboard, so that both full at once still leave the reserve free.

Should descriptors run out anyway (another listener, a handler opening files),
asyncio reports each failed accept through the loop's exception handler, with a
traceback, as often as the listener is retried: `AcceptFailures` turns that into
one line per interval with a count.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("leasehold.connections")

DEFAULT_HANDSHAKE_TIMEOUT_SECONDS = 10.0
# Long enough that a client calling once every few minutes keeps its connection
# (and its TLS session); short enough that a held-open connection with nothing
# on it is given back within minutes.
DEFAULT_CONNECTION_IDLE_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 86_400.0
# uvicorn's own default: how long a dashboard connection waits for the next
# request once a response is sent (never longer than the idle timeout).
DASHBOARD_KEEP_ALIVE_SECONDS = 5
# Prometheus scrapers are few and each scrape is one short request: a thread each.
METRICS_MAX_CONNECTIONS = 16
# Descriptors kept out of the caps beyond the database pool: the writer and the
# change listener, the metrics listener and its connections, the dashboard's
# channel to the API, log files, handler files, threads' pipes and the rest.
RESERVED_DESCRIPTORS = 100 + METRICS_MAX_CONNECTIONS
# With a generous limit (often 1,048,576), caps this big already mean tens of
# thousands of clients; the limit itself would not.
DEFAULT_MAX_GRPC_CONNECTIONS = 10_000
DEFAULT_MAX_DASHBOARD_CONNECTIONS = 1_000
ACCEPT_FAILED_MESSAGE = "socket.accept() out of system resource"
ACCEPT_FAILURE_LOG_SECONDS = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    """The listeners' bounds (serve --grpc-max-connections and the rest). A cap
    of None is derived from the descriptor limit by `caps()`."""

    grpc_max_connections: int | None = None
    dashboard_max_connections: int | None = None
    handshake_timeout_seconds: float = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
    connection_idle_seconds: float = DEFAULT_CONNECTION_IDLE_SECONDS

    def __post_init__(self) -> None:
        for name in ("grpc_max_connections", "dashboard_max_connections"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: must be at least 1")
        for name in ("handshake_timeout_seconds", "connection_idle_seconds"):
            value = getattr(self, name)
            if not 0 < value <= MAX_TIMEOUT_SECONDS:  # also refuses NaN
                raise ValueError(f"{name}: must be more than 0 and at most {MAX_TIMEOUT_SECONDS:g} seconds")

    def caps(self, descriptor_limit: int, database_pool_size: int) -> Caps:
        """The gRPC and dashboard caps under `descriptor_limit`, and whether
        they (as set) leave the reserve free."""
        reserve = RESERVED_DESCRIPTORS + database_pool_size
        room = max(descriptor_limit - reserve, 2)
        grpc_cap = self.grpc_max_connections or max(min(room * 3 // 4, DEFAULT_MAX_GRPC_CONNECTIONS), 1)
        dashboard_cap = self.dashboard_max_connections or max(
            min(room // 4, DEFAULT_MAX_DASHBOARD_CONNECTIONS), 1
        )
        return Caps(grpc_cap, dashboard_cap, fits=grpc_cap + dashboard_cap + reserve <= descriptor_limit)

    @property
    def dashboard_keep_alive_seconds(self) -> int:
        """Whole seconds, as uvicorn takes them."""
        return max(int(min(DASHBOARD_KEEP_ALIVE_SECONDS, self.connection_idle_seconds)), 1)


@dataclass(frozen=True)
class Caps:
    grpc: int
    dashboard: int
    # False when caps set by flag could together use descriptors the database needs.
    fits: bool


def grpc_options(limits: ConnectionLimits, max_connections: int) -> tuple[tuple[str, int], ...]:
    """grpc core's channel arguments for these limits, each checked against the
    installed grpcio by tests/system/test_connection_limits.py.

    - server_handshake_timeout_ms: covers the TCP connection until the client's
      HTTP/2 SETTINGS arrive (TLS included), so a connection sending nothing,
      or only the preface, is closed (grpc's default: 120 s).
    - max_connection_idle_ms: counts only while no call is open, so a
      WatchEvents stream or a long-poll Claim keeps its connection; the client
      gets a GOAWAY and reconnects at its next call.
    - max_allowed_incoming_connections: per listener; a connection above it is
      closed as soon as it is accepted, the others go on.

    Not used: max_connection_age_ms would end every WatchEvents stream at that
    age (UNAVAILABLE once its grace is over), which is what this service's
    watchers must not see; server keepalive pings are not sent on a connection
    with no call, so they add nothing against idle connections (grpc's default,
    a ping after two hours on a connection with calls, stays)."""
    return (
        ("grpc.server_handshake_timeout_ms", _milliseconds(limits.handshake_timeout_seconds)),
        ("grpc.max_connection_idle_ms", _milliseconds(limits.connection_idle_seconds)),
        ("grpc.max_allowed_incoming_connections", max_connections),
    )


def _milliseconds(seconds: float) -> int:
    return max(int(seconds * 1000), 1)


@dataclass(frozen=True)
class DescriptorLimit:
    limit: int
    hard: int
    raised_from: int


def raise_descriptor_limit() -> DescriptorLimit:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit: the soft
    one is often 1,024, which a few hundred clients exhaust."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return DescriptorLimit(soft, hard, soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):  # e.g. macOS refuses more than OPEN_MAX
        return DescriptorLimit(soft, hard, soft)
    return DescriptorLimit(hard, hard, soft)


def descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE now (what `serve` raised it to)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class RateLimited:
    """Counts occurrences and says when one line about them may be written: the
    first at once, then at most one per `interval` seconds, each with the count
    since the last line."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._last: float | None = None
        self._count = 0

    def occurred(self) -> int:
        """Note one occurrence; the count to report now, or 0 to stay quiet."""
        self._count += 1
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            return 0
        self._last = now
        count, self._count = self._count, 0
        return count


ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


class AcceptFailures:
    """An event loop exception handler: asyncio's "socket.accept() out of system
    resource" (descriptors or memory ran out; the listener pauses a second and
    retries) becomes one `server.accept_failed` line per interval with how many
    accepts failed; every other report goes on to the previous handler, or the
    loop's default, unchanged."""

    def __init__(
        self,
        previous: ExceptionHandler | None = None,
        interval: float = ACCEPT_FAILURE_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._previous = previous
        self._interval = interval
        self._rate = RateLimited(interval, clock)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != ACCEPT_FAILED_MESSAGE:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        count = self._rate.occurred()
        if count:
            exception = context.get("exception")
            log.warning(
                "server.accept_failed",
                failed=count,
                error=type(exception).__name__ if exception is not None else None,
                reason=str(exception) if exception is not None else None,
                message=f"refusing new connections: out of descriptors or memory "
                f"(at most one line per {self._interval:g} s)",
            )

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop) -> AcceptFailures:
        handler = cls(loop.get_exception_handler())
        loop.set_exception_handler(handler)
        return handler


class RateLimitedRecords(logging.Filter):
    """A logging filter that lets a record with one of `messages` through at most
    once per interval (with `repeated` set to how many it stood for); others pass."""

    def __init__(self, messages: tuple[str, ...], interval: float = ACCEPT_FAILURE_LOG_SECONDS) -> None:
        super().__init__()
        self._rates = {message: RateLimited(interval) for message in messages}

    def filter(self, record: logging.LogRecord) -> bool:
        rate = self._rates.get(record.getMessage())
        if rate is None:
            return True
        count = rate.occurred()
        record.repeated = count
        return count > 0

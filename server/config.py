"""Service settings: one frozen, validated value built from flags and environment."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from leasehold._server.addresses import ensure_free, split_address
from leasehold._server.api.call_gate import DEFAULT_MAX_CALLS_PER_OWNER
from leasehold._server.api.watch_streams import WatchLimits
from leasehold._server.auth.settings import AuthSettings, is_loopback
from leasehold._server.connections import ConnectionLimits
from leasehold._server.defaults import (
    DEFAULT_DATABASE_URL,
    DEFAULT_LISTEN,
    DEFAULT_MAX_EVENTS_PER_JOB,
    DEFAULT_POOL_SIZE,
    DEFAULT_RETENTION,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
)
from leasehold._server.jobs.owner_limits import OwnerLimits
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.jobs.sibling_bus import SiblingGroup
from leasehold._server.jobs.steering import NO_STEERING, Steering
from leasehold._server.runtime.claim_loop import RuntimeSettings

MAX_CONCURRENCY = 4096
MAX_PROCESSES = 256
MAX_POOL_SIZE = 1000
BUILTIN_HANDLERS = ("leasehold.examples",)
EVENT_LOOPS = ("asyncio", "uvloop")
MIN_WORKER_TOKEN_LENGTH = 16
MAX_CANCEL_GRACE_SECONDS = 86_400.0
MAX_SHUTDOWN_GRACE_SECONDS = 3_600.0
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}
# Ten years: anything longer is a typo for "keep forever" (which is 0).
MAX_RETENTION_SECONDS = 3_650 * 86_400


def parse_duration(text: str) -> float:
    """`30s`, `15m`, `12h`, `7d` in seconds; `0` is 0. ValueError otherwise."""
    text = text.strip()
    if text == "0":
        return 0.0
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"expected a number and a unit (30s, 15m, 12h, 7d) or 0, got {text!r}")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not 0 < seconds <= MAX_RETENTION_SECONDS:
        raise ValueError(f"must be more than 0 and at most {MAX_RETENTION_SECONDS // 86_400}d, or 0")
    return float(seconds)


def describe_duration(seconds: float) -> str:
    if seconds == 0:
        return "keep forever"
    for unit in ("d", "h", "m"):
        if seconds % _UNIT_SECONDS[unit] == 0:
            return f"{int(seconds // _UNIT_SECONDS[unit])}{unit}"
    return f"{int(seconds)}s"


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    listen: str = DEFAULT_LISTEN
    database_pool_size: int = DEFAULT_POOL_SIZE
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    handler_modules: tuple[str, ...] = BUILTIN_HANDLERS
    # Signs List page tokens. Without one, a random key per process: tokens then
    # stop working across a restart or between replicas.
    page_token_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    log_level: str = "info"
    event_loop: str = "asyncio"
    # Kinds (or `prefix.*` patterns) that only remote workers run (DESIGN §10).
    remote_kinds: tuple[str, ...] = ()
    # The bearer token every WorkerService call must carry; None refuses them all.
    worker_token: str | None = field(default=None, repr=False)
    # How long a running attempt may go on after a cancel request; None: one lease.
    cancel_grace_seconds: float | None = None
    # The claim order's limits and weights (serve --kind-limit and the rest).
    steering: Steering = NO_STEERING
    # Finished jobs older than this are deleted with their events; 0 keeps them.
    retention_seconds: float = field(default_factory=lambda: parse_duration(DEFAULT_RETENTION))
    # HOST:PORT serving Prometheus text on /metrics; None: no metrics.
    metrics_listen: str | None = None
    # The drain and the limits (DESIGN §13; docs/operations.md).
    shutdown_grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS
    watch_limits: WatchLimits = field(default_factory=WatchLimits)
    max_events_per_job: int = DEFAULT_MAX_EVENTS_PER_JOB
    # Distinct kinds, resource types and schedules one owner may have (serve --max-*-per-owner).
    owner_limits: OwnerLimits = field(default_factory=OwnerLimits)
    # Kinds (or `prefix.*` patterns) with metrics series of their own besides the
    # in-process handlers' kinds; the rest are counted as kind="other".
    metrics_kinds: tuple[str, ...] = ()
    # serve --auth and the TLS flags (server/auth/settings.py).
    auth: AuthSettings = field(default_factory=AuthSettings)
    # Unary calls one owner may have in flight at once (serve --max-calls-per-owner).
    max_calls_per_owner: int = DEFAULT_MAX_CALLS_PER_OWNER
    # HOST:PORT serving the web dashboard; None: no dashboard.
    dashboard_listen: str | None = None
    # The Host names the dashboard answers to (empty: its listen host and
    # localhost), and the proxies whose X-Forwarded-* headers it believes (none).
    dashboard_allowed_hosts: tuple[str, ...] = ()
    forwarded_allow_ips: tuple[str, ...] = ()
    # Connection caps and timeouts of the gRPC, dashboard and metrics listeners
    # (serve --grpc-max-connections and the rest; server/connections.py).
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Leave every exception's message out of the logged tracebacks.
    redact_error_messages: bool = False
    # serve --processes: how many serving processes share the listen address.
    processes: int = 1
    # In one of those processes: its place among them (None: a process alone).
    siblings: SiblingGroup | None = None

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ValueError("database_url: must not be empty")
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"listen: expected HOST:PORT, got {self.listen!r}")
        if not 1 <= self.database_pool_size <= MAX_POOL_SIZE:
            raise ValueError(f"database_pool_size: must be between 1 and {MAX_POOL_SIZE}")
        if not 1 <= self.processes <= MAX_PROCESSES:
            raise ValueError(f"processes: must be between 1 and {MAX_PROCESSES}")
        if self.runtime.concurrency > MAX_CONCURRENCY:
            raise ValueError(f"concurrency: must be at most {MAX_CONCURRENCY}")
        KindPatterns.parse(self.remote_kinds)  # raises naming remote_kinds
        KindPatterns.parse(self.metrics_kinds, field="metrics_kinds")
        if self.worker_token is not None and len(self.worker_token) < MIN_WORKER_TOKEN_LENGTH:
            raise ValueError(
                f"worker_token: LEASEHOLD_WORKER_TOKEN must be at least {MIN_WORKER_TOKEN_LENGTH} characters"
            )
        grace = self.cancel_grace_seconds
        if grace is not None and not 0 < grace <= MAX_CANCEL_GRACE_SECONDS:  # also refuses NaN
            raise ValueError(
                f"cancel_grace_seconds: must be more than 0 and at most {MAX_CANCEL_GRACE_SECONDS:g}"
            )
        if not 0 <= self.retention_seconds <= MAX_RETENTION_SECONDS:  # also refuses NaN
            raise ValueError(f"retention: must be between 0 and {MAX_RETENTION_SECONDS} seconds")
        if self.metrics_listen is not None:
            try:
                split_address(self.metrics_listen)
            except ValueError as exc:
                raise ValueError(f"metrics_listen: {exc}") from None
        if not 0 <= self.shutdown_grace_seconds <= MAX_SHUTDOWN_GRACE_SECONDS:  # also refuses NaN
            raise ValueError(f"shutdown_grace: must be between 0 and {MAX_SHUTDOWN_GRACE_SECONDS:g} seconds")
        if self.max_events_per_job < 1:
            raise ValueError("max_events_per_job: must be at least 1")
        if not self.handler_modules:
            raise ValueError("handlers: name at least one module")
        if len(self.page_token_key) < 16:
            raise ValueError("page_token_key: must be at least 16 bytes")
        if self.log_level.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("log_level: one of debug, info, warning, error")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"event_loop: one of {', '.join(EVENT_LOOPS)}")
        self.auth.check_listen(self.listen)
        if self.max_calls_per_owner < 1:
            raise ValueError("max_calls_per_owner: must be at least 1")
        if self.dashboard_listen is not None:
            _check_dashboard(self.dashboard_listen, self.auth)

    def ensure_listeners_free(self) -> None:
        """ValueError naming the flag when another process already listens on
        the gRPC, metrics or dashboard address. One of `serve --processes`
        shares the first with its siblings, deliberately."""
        for flag, address in (
            ("listen", None if self.siblings is not None else self.listen),
            ("--metrics-listen", self.metrics_listen),
            ("--dashboard-listen", self.dashboard_listen),
        ):
            if address is not None:
                ensure_free(flag, address)

    @property
    def remote_kind_patterns(self) -> KindPatterns:
        return KindPatterns.parse(self.remote_kinds)

    @property
    def metrics_kind_patterns(self) -> KindPatterns:
        return KindPatterns.parse(self.metrics_kinds, field="metrics_kinds")

    @property
    def cancel_grace(self) -> float:
        """The cancel grace in seconds: one lease unless set."""
        return self.runtime.lease_seconds if self.cancel_grace_seconds is None else self.cancel_grace_seconds


def _check_dashboard(address: str, auth: AuthSettings) -> None:
    try:
        host, _ = split_address(address)
    except ValueError as exc:
        raise ValueError(f"dashboard_listen: {exc}") from None
    if auth.mode == "header" and not (auth.allow_insecure_header_auth or is_loopback(host)):
        # Unlike the gRPC listener, TLS does not make this safe: behind TLS a
        # gateway may set x-owner-id for callers, but the sign-in form takes
        # whatever owner id a browser types.
        raise ValueError(
            f"dashboard_listen: --auth header signs in with a bare owner id anyone can type, so the "
            f"dashboard listens only on loopback, not {host}: use --auth token or jwt, or "
            "--allow-insecure-header-auth (only behind a gateway that authenticates callers)"
        )
    if auth.mode == "mtls":
        raise ValueError(
            "dashboard_listen: --auth mtls has no bearer credential to sign in to the dashboard with; "
            "use --auth token or jwt"
        )

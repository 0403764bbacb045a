"""`serve`'s drain and limit flags (DESIGN §13), kept apart from serve_flags.py's others."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from leasehold._server.api.watch_streams import (
    DEFAULT_MAX_WATCH_STREAMS,
    DEFAULT_MAX_WATCH_STREAMS_PER_OWNER,
    WatchLimits,
)
from leasehold._server.connections import DEFAULT_CONNECTION_IDLE_SECONDS, DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
from leasehold._server.defaults import DEFAULT_MAX_EVENTS_PER_JOB, DEFAULT_SHUTDOWN_GRACE_SECONDS
from leasehold._server.jobs.owner_limits import (
    DEFAULT_MAX_KINDS_PER_OWNER,
    DEFAULT_MAX_RESOURCE_TYPES_PER_OWNER,
    DEFAULT_MAX_SCHEDULES_PER_OWNER,
    OwnerLimits,
)

# (name, default, type): the flag's value from the command line or LEASEHOLD_<NAME>.
Number = Callable[[str, str, type[int] | type[float]], float]


def drain_and_limit_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--shutdown-grace",
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long running handlers get to finish before they are handed "
        f"back to the queue (default {DEFAULT_SHUTDOWN_GRACE_SECONDS:g})",
    )
    serve.add_argument(
        "--max-watch-streams",
        metavar="N",
        help=f"open WatchEvents and Subscribe streams on this server (default {DEFAULT_MAX_WATCH_STREAMS})",
    )
    serve.add_argument(
        "--max-watch-streams-per-owner",
        metavar="N",
        help="open WatchEvents and Subscribe streams of one owner on this server "
        f"(default {DEFAULT_MAX_WATCH_STREAMS_PER_OWNER})",
    )
    serve.add_argument(
        "--max-events-per-job",
        metavar="N",
        help="events in one job's log past which handlers and workers may append no more "
        f"(default {DEFAULT_MAX_EVENTS_PER_JOB})",
    )
    serve.add_argument(
        "--max-kinds-per-owner",
        metavar="N",
        help="distinct kinds one owner's jobs may have; a job of a new kind past them is refused "
        f"(default {DEFAULT_MAX_KINDS_PER_OWNER}; 0: no limit)",
    )
    serve.add_argument(
        "--max-resource-types-per-owner",
        metavar="N",
        help="distinct resource types one owner's jobs may have "
        f"(default {DEFAULT_MAX_RESOURCE_TYPES_PER_OWNER}; 0: no limit)",
    )
    serve.add_argument(
        "--max-schedules-per-owner",
        metavar="N",
        help=f"schedules one owner may have (default {DEFAULT_MAX_SCHEDULES_PER_OWNER}; 0: no limit)",
    )

    connection_flags(serve)


def connection_flags(serve: argparse.ArgumentParser) -> None:
    """The listeners' caps and timeouts (server/connections.py)."""
    serve.add_argument(
        "--grpc-max-connections",
        metavar="N",
        help="open connections to the gRPC port; more are closed as soon as accepted "
        "(default: three quarters of the descriptors left after the database's, at most 10000)",
    )
    serve.add_argument(
        "--dashboard-max-connections",
        metavar="N",
        help="open connections to the dashboard; more are closed as soon as accepted "
        "(default: a quarter of the descriptors left after the database's, at most 1000)",
    )
    serve.add_argument(
        "--handshake-timeout-seconds",
        metavar="SECONDS",
        help="how long a new connection may take to finish its HTTP/2 handshake (gRPC) or send "
        f"a request's headers (dashboard, metrics) before it is closed "
        f"(default {DEFAULT_HANDSHAKE_TIMEOUT_SECONDS:g})",
    )
    serve.add_argument(
        "--connection-idle-seconds",
        metavar="SECONDS",
        help="how long a gRPC connection with no call open (a watch stream or a waiting Claim "
        f"is one) stays open (default {DEFAULT_CONNECTION_IDLE_SECONDS:g})",
    )


@dataclass(frozen=True)
class DrainAndLimits:
    """The Settings fields these flags set."""

    shutdown_grace_seconds: float
    watch_limits: WatchLimits
    max_events_per_job: int
    owner_limits: OwnerLimits


def drain_and_limits(number: Number) -> DrainAndLimits:
    """ValueError names a bad setting."""
    return DrainAndLimits(
        shutdown_grace_seconds=number("shutdown_grace", str(DEFAULT_SHUTDOWN_GRACE_SECONDS), float),
        watch_limits=WatchLimits(
            max_streams=int(number("max_watch_streams", str(DEFAULT_MAX_WATCH_STREAMS), int)),
            max_streams_per_owner=int(
                number("max_watch_streams_per_owner", str(DEFAULT_MAX_WATCH_STREAMS_PER_OWNER), int)
            ),
        ),
        max_events_per_job=int(number("max_events_per_job", str(DEFAULT_MAX_EVENTS_PER_JOB), int)),
        owner_limits=OwnerLimits(
            max_kinds=int(number("max_kinds_per_owner", str(DEFAULT_MAX_KINDS_PER_OWNER), int)),
            max_resource_types=int(
                number("max_resource_types_per_owner", str(DEFAULT_MAX_RESOURCE_TYPES_PER_OWNER), int)
            ),
            max_schedules=int(number("max_schedules_per_owner", str(DEFAULT_MAX_SCHEDULES_PER_OWNER), int)),
        ),
    )

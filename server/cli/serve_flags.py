"""`serve`'s and `migrate`'s flags, and how a flag's value is read: the flag,
else LEASEHOLD_<NAME>, else the default.

Only flags here, and defaults from `leasehold._server.defaults`: every command's
parser is built from this module, so it must not import what `serve` runs on
(SQLAlchemy, the runtime, the dashboard); serve.py does, when `serve` runs.
"""

from __future__ import annotations

import argparse

from leasehold._server.cli import auth_flags
from leasehold._server.cli.drain_flags import drain_and_limit_flags
from leasehold._server.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DATABASE_URL,
    DEFAULT_LISTEN,
    DEFAULT_POOL_SIZE,
    DEFAULT_RETENTION,
    env,
)
from leasehold._server.logs import redact_flag

EXIT_CONFIG = 2


class ConfigError(Exception):
    """A setting is wrong; the message names it."""


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="run the gRPC service and its workers")
    _database_flag(serve)
    serve.add_argument("--listen", help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    serve.add_argument("--concurrency", help=f"execution slots (default {DEFAULT_CONCURRENCY})")
    serve.add_argument(
        "--processes",
        help="serving processes sharing the listen address and the database, each a full replica "
        "with its own --concurrency (default 1)",
    )
    # Set by `serve --processes N` on the processes it starts, never by hand:
    # SLOT:FD:DIR, this process's slot, the pipe that closes when the supervisor
    # is gone, and the directory of the siblings' sockets.
    serve.add_argument("--serve-process", help=argparse.SUPPRESS)
    serve.add_argument("--lease-seconds", help="lease length (default 30, min 6)")
    serve.add_argument("--poll-seconds", help="idle safety-net poll (default 1, min 0.05)")
    serve.add_argument(
        "--rescue-seconds",
        help="how often expired leases are recovered on a timer (default lease/4; 0.05 to the lease)",
    )
    serve.add_argument(
        "--remote-kinds",
        nargs="+",
        metavar="PATTERN",
        help="kinds (or prefixes like media.*) that only remote workers run, over WorkerService "
        "(whose token is LEASEHOLD_WORKER_TOKEN)",
    )
    serve.add_argument(
        "--cancel-grace-seconds",
        help="how long a running job may go on after a cancel request before the server ends it "
        "cancelled (default: one lease)",
    )
    serve.add_argument(
        "--handlers",
        nargs="+",
        metavar="MODULE",
        help="modules defining register(registry); default: the built-in examples",
    )
    serve.add_argument(
        "--database-pool-size",
        help=f"most database connections for reads (default {DEFAULT_POOL_SIZE}); "
        "the writer and, on PostgreSQL, the change listener and retention's deletes hold one more each",
    )
    serve.add_argument(
        "--kind-limit",
        nargs="+",
        metavar="KIND=N",
        help="at most N running jobs of KIND, across every process on the database",
    )
    serve.add_argument("--owner-limit", help="at most N running jobs per owner, across every process")
    serve.add_argument(
        "--owner-weight",
        nargs="+",
        metavar="OWNER=W",
        help="OWNER's share of the slots against the others' (default 1 each)",
    )
    serve.add_argument(
        "--kind-rate",
        nargs="+",
        metavar="KIND=R/s[:BURST]",
        help="at most R starts of KIND a second, in bursts of up to BURST (default: R rounded up)",
    )
    serve.add_argument(
        "--retention",
        metavar="DURATION",
        help=f"delete finished jobs and their events this long after they end: 30s, 15m, 12h, 7d, "
        f"or 0 to keep every job (default {DEFAULT_RETENTION})",
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (default: off)",
    )
    serve.add_argument(
        "--metrics-kinds",
        nargs="+",
        metavar="PATTERN",
        help="kinds (or prefixes like media.*) that get a metrics series of their own besides those "
        'in-process handlers serve; every other kind is counted under kind="other"',
    )
    serve.add_argument(
        "--dashboard-listen",
        metavar="HOST:PORT",
        help="serve the web dashboard on HOST:PORT (default: off; HTTPS with --tls-cert)",
    )
    serve.add_argument(
        "--dashboard-allowed-hosts",
        nargs="+",
        metavar="HOST",
        help="Host names the dashboard answers to, e.g. jobs.example.com or *.example.com "
        "(default: its listen host and localhost); any other Host gets 400",
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        nargs="+",
        metavar="IP",
        help="proxies whose X-Forwarded-Proto and X-Forwarded-For the dashboard believes (default: none)",
    )
    drain_and_limit_flags(serve)
    serve.add_argument("--log-level", help="debug, info, warning or error (default info)")
    redact_flag(serve)
    serve.add_argument(
        "--event-loop",
        help="asyncio (default) or uvloop (install the extra: pip install 'leasehold[uvloop]')",
    )
    auth_flags.add_arguments(serve)

    migrate_cmd = commands.add_parser("migrate", help="bring the database schema up to date")
    _database_flag(migrate_cmd)


def _database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help=f"SQLAlchemy async URL (default {DEFAULT_DATABASE_URL})")


def setting(args: argparse.Namespace, name: str, default: str) -> str:
    """The flag, else LEASEHOLD_<NAME>, else the default."""
    value = getattr(args, name)
    if value is None:
        value = env(name.upper()) or default
    return str(value)


def number(args: argparse.Namespace, name: str, default: str, kind: type[int] | type[float]) -> float:
    text = setting(args, name, default)
    try:
        return kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise ConfigError(f"{source(args, name)}: expected {expected}, got {text!r}") from None


def optional_number(args: argparse.Namespace, name: str) -> float | None:
    """A number from the flag or the environment, or None when neither is set
    (the setting then has a default that depends on others)."""
    if getattr(args, name) is None and env(name.upper()) is None:
        return None
    return number(args, name, "", float)


def words(args: argparse.Namespace, name: str, default: str = "", sep: bool = False) -> list[str]:
    """A many-valued flag, else LEASEHOLD_<NAME> split at commas and spaces;
    with `sep`, the flag's own values are split at commas too (`a.*,b.*`)."""
    given: list[str] | None = getattr(args, name)
    if given and sep:
        return " ".join(given).replace(",", " ").split()
    return given or (env(name.upper()) or default).replace(",", " ").split()


def source(args: argparse.Namespace, name: str) -> str:
    """How a setting was given, for its error message."""
    return f"--{name.replace('_', '-')}" if getattr(args, name) is not None else f"LEASEHOLD_{name.upper()}"

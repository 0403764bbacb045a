"""`leasehold serve`, `leasehold migrate`, `leasehold worker` (worker.py),
`leasehold worker-conformance` (conformance/),
`leasehold token` (token.py) and the client commands `leasehold jobs|schedules|admin`
(jobs.py, schedules.py, admin.py).

Every flag can also come from the environment as LEASEHOLD_<FLAG> (dashes become
underscores); a flag on the command line wins. Configuration mistakes end with one
line naming the setting and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

import leasehold
from leasehold._server import migrate, tracing
from leasehold._server.addresses import split_address
from leasehold._server.app import LeaseholdApp, load_handlers
from leasehold._server.cli import (
    admin,
    auth_flags,
    client_runner,
    jobs,
    schedules,
    steering_flags,
    token,
    worker,
)
from leasehold._server.cli.drain_flags import drain_and_limit_flags, drain_and_limits
from leasehold._server.config import (
    BUILTIN_HANDLERS,
    DEFAULT_DATABASE_URL,
    DEFAULT_LISTEN,
    DEFAULT_RETENTION,
    Settings,
    env,
    parse_duration,
)
from leasehold._server.conformance import command as conformance_command
from leasehold._server.connections import (
    DEFAULT_CONNECTION_IDLE_SECONDS,
    DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    AcceptFailures,
    ConnectionLimits,
    raise_descriptor_limit,
)
from leasehold._server.gc_tuning import settle_after_startup
from leasehold._server.jobs.sql.engines import DEFAULT_POOL_SIZE, check_database_url
from leasehold._server.jobs.steering import Steering
from leasehold._server.logs import configure_logging, redact_flag, redact_requested
from leasehold._server.runtime.claim_loop import DEFAULT_CONCURRENCY, RuntimeSettings
from leasehold._server.runtime.registry import HandlerRegistry

log = structlog.get_logger("leasehold.cli")

EXIT_CONFIG = 2
CLIENT_COMMANDS = frozenset({"jobs", "schedules", "admin"})

DESCRIPTION = """Leasehold: durable background jobs over gRPC. `leasehold serve` runs the service,
`leasehold worker` runs handlers for its remote kinds, `leasehold worker-conformance` checks
a worker in any language, and `leasehold jobs|schedules|admin` talk to a running server.
Every flag can also come from the environment as LEASEHOLD_<FLAG> (dashes become
underscores); a flag on the command line wins.
Run `leasehold COMMAND --help` for a command's flags."""


class ConfigError(Exception):
    """A setting is wrong; the message names it."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leasehold", description=DESCRIPTION)
    # Prints "leasehold <version>" to stdout and exits 0, before any command is required.
    parser.add_argument("--version", action="version", version=f"%(prog)s {leasehold.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gRPC service and its workers")
    _database_flag(serve)
    serve.add_argument("--listen", help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    serve.add_argument("--concurrency", help=f"execution slots (default {DEFAULT_CONCURRENCY})")
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
    worker.add_parser(commands)
    conformance_command.add_parser(commands)
    token.add_parser(commands)
    jobs.add_parser(commands)
    schedules.add_parser(commands)
    admin.add_parser(commands)
    return parser


def _database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help=f"SQLAlchemy async URL (default {DEFAULT_DATABASE_URL})")


def _setting(args: argparse.Namespace, name: str, default: str) -> str:
    """The flag, else LEASEHOLD_<NAME>, else the default."""
    value = getattr(args, name)
    if value is None:
        value = env(name.upper()) or default
    return str(value)


def _number(args: argparse.Namespace, name: str, default: str, kind: type[int] | type[float]) -> float:
    text = _setting(args, name, default)
    try:
        return kind(text)
    except ValueError:
        source = (
            f"--{name.replace('_', '-')}" if getattr(args, name) is not None else f"LEASEHOLD_{name.upper()}"
        )
        expected = "an integer" if kind is int else "a number"
        raise ConfigError(f"{source}: expected {expected}, got {text!r}") from None


def _optional_number(args: argparse.Namespace, name: str) -> float | None:
    """A number from the flag or the environment, or None when neither is set
    (the setting then has a default that depends on others)."""
    if getattr(args, name) is None and env(name.upper()) is None:
        return None
    return _number(args, name, "", float)


def _database_url(args: argparse.Namespace) -> str:
    url = _setting(args, "database_url", DEFAULT_DATABASE_URL)
    try:
        check_database_url(url)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return url


def _words(args: argparse.Namespace, name: str, default: str = "", sep: bool = False) -> list[str]:
    """A many-valued flag, else LEASEHOLD_<NAME> split at commas and spaces;
    with `sep`, the flag's own values are split at commas too (`a.*,b.*`)."""
    given: list[str] | None = getattr(args, name)
    if given and sep:
        return " ".join(given).replace(",", " ").split()
    return given or (env(name.upper()) or default).replace(",", " ").split()


def _source(args: argparse.Namespace, name: str) -> str:
    """How a setting was given, for its error message."""
    return f"--{name.replace('_', '-')}" if getattr(args, name) is not None else f"LEASEHOLD_{name.upper()}"


def _steering(args: argparse.Namespace) -> Steering:
    names = ("kind_limit", "owner_limit", "owner_weight", "kind_rate")
    owner_limit = args.owner_limit if args.owner_limit is not None else env("OWNER_LIMIT")
    try:
        return steering_flags.steering(
            _words(args, "kind_limit"),
            owner_limit,
            _words(args, "owner_weight"),
            _words(args, "kind_rate"),
            source={name: _source(args, name) for name in names},
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _retention(args: argparse.Namespace) -> float:
    try:
        return parse_duration(_setting(args, "retention", DEFAULT_RETENTION))
    except ValueError as exc:
        raise ConfigError(f"{_source(args, 'retention')}: {exc}") from None


def _metrics_listen(args: argparse.Namespace) -> str | None:
    address = _setting(args, "metrics_listen", "") or None
    if address is not None:
        try:
            split_address(address)
        except ValueError as exc:
            raise ConfigError(f"{_source(args, 'metrics_listen')}: {exc}") from None
    return address


def _connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    grpc_cap = _optional_number(args, "grpc_max_connections")
    dashboard_cap = _optional_number(args, "dashboard_max_connections")
    for name, value in (("grpc_max_connections", grpc_cap), ("dashboard_max_connections", dashboard_cap)):
        if value is not None and (value != int(value) or value < 1):
            raise ConfigError(f"{_source(args, name)}: expected a whole number of at least 1, got {value:g}")
    try:
        return ConnectionLimits(
            grpc_max_connections=None if grpc_cap is None else int(grpc_cap),
            dashboard_max_connections=None if dashboard_cap is None else int(dashboard_cap),
            handshake_timeout_seconds=_number(
                args, "handshake_timeout_seconds", str(DEFAULT_HANDSHAKE_TIMEOUT_SECONDS), float
            ),
            connection_idle_seconds=_number(
                args, "connection_idle_seconds", str(DEFAULT_CONNECTION_IDLE_SECONDS), float
            ),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _settings(args: argparse.Namespace) -> Settings:
    handlers = _words(args, "handlers", " ".join(BUILTIN_HANDLERS))
    remote_kinds = _words(args, "remote_kinds")
    steering_rules = _steering(args)
    key = env("PAGE_TOKEN_KEY")
    extra: dict[str, Any] = {"page_token_key": key.encode()} if key else {}
    try:
        extra.update(auth_flags.settings(args))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        drain = drain_and_limits(lambda name, default, kind: _number(args, name, default, kind))
        return Settings(
            database_url=_database_url(args),
            listen=_setting(args, "listen", DEFAULT_LISTEN),
            runtime=RuntimeSettings(
                concurrency=int(_number(args, "concurrency", str(DEFAULT_CONCURRENCY), int)),
                lease_seconds=_number(args, "lease_seconds", "30", float),
                poll_seconds=_number(args, "poll_seconds", "1", float),
                rescue_seconds=_optional_number(args, "rescue_seconds"),
            ),
            database_pool_size=int(_number(args, "database_pool_size", str(DEFAULT_POOL_SIZE), int)),
            handler_modules=tuple(handlers),
            log_level=_setting(args, "log_level", "info"),
            event_loop=_setting(args, "event_loop", "asyncio"),
            remote_kinds=tuple(remote_kinds),
            worker_token=env("WORKER_TOKEN") or None,
            cancel_grace_seconds=_optional_number(args, "cancel_grace_seconds"),
            steering=steering_rules,
            retention_seconds=_retention(args),
            metrics_listen=_metrics_listen(args),
            metrics_kinds=tuple(_words(args, "metrics_kinds", sep=True)),
            dashboard_listen=_setting(args, "dashboard_listen", "") or None,
            dashboard_allowed_hosts=tuple(_words(args, "dashboard_allowed_hosts")),
            forwarded_allow_ips=tuple(_words(args, "forwarded_allow_ips")),
            redact_error_messages=redact_requested(args),
            shutdown_grace_seconds=drain.shutdown_grace_seconds,
            watch_limits=drain.watch_limits,
            max_events_per_job=drain.max_events_per_job,
            connections=_connection_limits(args),
            owner_limits=drain.owner_limits,
            **extra,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _handlers(settings: Settings) -> HandlerRegistry:
    try:
        return load_handlers(settings.handler_modules)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_credentials(settings: Settings) -> None:
    """Read the token file, JWT keys and TLS files, and look at the listen
    addresses, once before anything else happens, so a bad one is one line and
    exit 2, not a half-started server."""
    try:
        settings.auth.authenticator(settings.worker_token)
        settings.auth.server_credentials()
        settings.ensure_listeners_free()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _migrate(database_url: str) -> None:
    try:
        migrate.upgrade(database_url)
    except (SQLAlchemyError, OSError) as exc:
        cause = getattr(exc, "orig", None) or exc  # the driver's words, without SQLAlchemy's links
        # One line: libpq's messages span several.
        words = " ".join(str(cause).split())
        raise ConfigError(f"database_url: cannot migrate {_redacted(database_url)}: {words}") from None


async def _serve(settings: Settings, registry: HandlerRegistry) -> None:
    app = LeaseholdApp(settings, registry=registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # The first asks for a drain; any later one cuts its grace short.
        if stop.is_set():
            app.hurry()
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    loop.add_signal_handler(signal.SIGHUP, app.reload_credentials)
    # Out of descriptors, asyncio reports every failed accept with a traceback.
    AcceptFailures.install(loop)
    try:
        try:
            await app.start(run_migrations=False)
        except ValueError as exc:  # e.g. the listen address cannot be bound
            raise ConfigError(str(exc)) from None
        settle_after_startup()
        await stop.wait()
        log.info("server.stopping")
    finally:
        await app.stop(grace_seconds=settings.shutdown_grace_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "worker":
        return worker.main(args)
    if args.command == "worker-conformance":
        return conformance_command.main(args)
    if args.command == "token":
        return token.main(args)
    if args.command in CLIENT_COMMANDS:
        return client_runner.run(args)
    try:
        if args.command == "migrate":
            configure_logging()
            database_url = _database_url(args)
            _migrate(database_url)
            log.info("migrate.done", database_url=_redacted(database_url))
            return 0
        settings = _settings(args)
        _check_credentials(settings)
        export = _tracing_export()
        configure_logging(settings.log_level, redact_error_messages=settings.redact_error_messages)
        _raise_descriptor_limit(settings)
        log.info("tracing.export", exporter=export.description)
        registry = _handlers(settings)
        _migrate(settings.database_url)
        with (
            contextlib.suppress(KeyboardInterrupt),
            export,
            asyncio.Runner(loop_factory=_loop_factory(settings)) as runner,
        ):
            runner.run(_serve(settings, registry))
    except ConfigError as exc:
        print(f"leasehold: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _raise_descriptor_limit(settings: Settings) -> None:
    """Every connection is a descriptor: take all the process may have, and say
    what that is and the connection caps it gives."""
    got = raise_descriptor_limit()
    caps = settings.connections.caps(got.limit, settings.database_pool_size)
    log.info(
        "server.descriptor_limit",
        limit=got.limit,
        hard_limit=got.hard,
        raised_from=got.raised_from,
        grpc_max_connections=caps.grpc,
        dashboard_max_connections=caps.dashboard if settings.dashboard_listen else None,
    )
    if not caps.fits:
        log.warning(
            "server.connection_caps_exceed_descriptors",
            message=f"--grpc-max-connections and --dashboard-max-connections together leave too few of "
            f"the {got.limit} descriptors for the database pool and the rest: connections may be "
            "refused before the caps are reached",
        )


def _tracing_export() -> tracing.Export:
    """Span export as the standard OTEL_* variables say (README: Tracing)."""
    try:
        return tracing.export_from_environment(os.environ, "leasehold")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if settings.event_loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise ConfigError(
            "event_loop: uvloop is not installed; install it with pip install 'leasehold[uvloop]'"
        ) from None
    return uvloop.new_event_loop


def _redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


if __name__ == "__main__":
    sys.exit(main())

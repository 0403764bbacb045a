"""`leasehold serve`: its settings from the flags and the environment, then the
service until SIGINT or SIGTERM (the first drains, a second cuts the drain
short) with SIGHUP re-reading its credentials.

Imported only when `serve` runs (main.py): this is where the whole service stack
comes in.
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

from leasehold._server import tracing
from leasehold._server.addresses import join_address, split_address
from leasehold._server.app import LeaseholdApp, load_handlers
from leasehold._server.cli import auth_flags, serve_processes, steering_flags
from leasehold._server.cli.drain_flags import drain_and_limits
from leasehold._server.cli.migrate import database_url, upgrade_schema
from leasehold._server.cli.serve_flags import (
    EXIT_CONFIG,
    ConfigError,
    number,
    optional_number,
    setting,
    source,
    words,
)
from leasehold._server.cli.serve_processes import ProcessSlot
from leasehold._server.config import BUILTIN_HANDLERS, MAX_PROCESSES, Settings, parse_duration
from leasehold._server.connections import (
    DEFAULT_CONNECTION_IDLE_SECONDS,
    DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    AcceptFailures,
    ConnectionLimits,
    raise_descriptor_limit,
)
from leasehold._server.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LISTEN,
    DEFAULT_POOL_SIZE,
    DEFAULT_RETENTION,
    env,
)
from leasehold._server.gc_tuning import settle_after_startup
from leasehold._server.jobs.steering import Steering
from leasehold._server.logs import configure_logging, redact_requested
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold._server.runtime.registry import HandlerRegistry

log = structlog.get_logger("leasehold.cli")


def _steering(args: argparse.Namespace) -> Steering:
    names = ("kind_limit", "owner_limit", "owner_weight", "kind_rate")
    owner_limit = args.owner_limit if args.owner_limit is not None else env("OWNER_LIMIT")
    try:
        return steering_flags.steering(
            words(args, "kind_limit"),
            owner_limit,
            words(args, "owner_weight"),
            words(args, "kind_rate"),
            source={name: source(args, name) for name in names},
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _retention(args: argparse.Namespace) -> float:
    try:
        return parse_duration(setting(args, "retention", DEFAULT_RETENTION))
    except ValueError as exc:
        raise ConfigError(f"{source(args, 'retention')}: {exc}") from None


def _metrics_listen(args: argparse.Namespace, slot: ProcessSlot | None) -> str | None:
    """The flag's address; one of `serve --processes` takes the port after its
    previous sibling's (each process's metrics on a port of its own)."""
    address = setting(args, "metrics_listen", "") or None
    if address is not None:
        try:
            host, port = split_address(address)
        except ValueError as exc:
            raise ConfigError(f"{source(args, 'metrics_listen')}: {exc}") from None
        if slot is not None and port != 0:
            address = join_address(host, port + slot.slot)
    return address


def _processes(args: argparse.Namespace) -> int:
    count = int(number(args, "processes", "1", int))
    if not 1 <= count <= MAX_PROCESSES:
        raise ConfigError(f"{source(args, 'processes')}: must be between 1 and {MAX_PROCESSES}, got {count}")
    return count


def _connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    grpc_cap = optional_number(args, "grpc_max_connections")
    dashboard_cap = optional_number(args, "dashboard_max_connections")
    for name, value in (("grpc_max_connections", grpc_cap), ("dashboard_max_connections", dashboard_cap)):
        if value is not None and (value != int(value) or value < 1):
            raise ConfigError(f"{source(args, name)}: expected a whole number of at least 1, got {value:g}")
    try:
        return ConnectionLimits(
            grpc_max_connections=None if grpc_cap is None else int(grpc_cap),
            dashboard_max_connections=None if dashboard_cap is None else int(dashboard_cap),
            handshake_timeout_seconds=number(
                args, "handshake_timeout_seconds", str(DEFAULT_HANDSHAKE_TIMEOUT_SECONDS), float
            ),
            connection_idle_seconds=number(
                args, "connection_idle_seconds", str(DEFAULT_CONNECTION_IDLE_SECONDS), float
            ),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def settings_from(args: argparse.Namespace, slot: ProcessSlot | None = None) -> Settings:
    """The settings the flags and the environment give; `slot` places one of
    `serve --processes`' children among its siblings (`--serve-process`)."""
    processes = _processes(args)
    handlers = words(args, "handlers", " ".join(BUILTIN_HANDLERS))
    remote_kinds = words(args, "remote_kinds")
    steering_rules = _steering(args)
    key = env("PAGE_TOKEN_KEY")
    extra: dict[str, Any] = {"page_token_key": key.encode()} if key else {}
    try:
        extra.update(auth_flags.settings(args))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        drain = drain_and_limits(lambda name, default, kind: number(args, name, default, kind))
        return Settings(
            database_url=database_url(args),
            listen=setting(args, "listen", DEFAULT_LISTEN),
            runtime=RuntimeSettings(
                concurrency=int(number(args, "concurrency", str(DEFAULT_CONCURRENCY), int)),
                lease_seconds=number(args, "lease_seconds", "30", float),
                poll_seconds=number(args, "poll_seconds", "1", float),
                rescue_seconds=optional_number(args, "rescue_seconds"),
            ),
            database_pool_size=int(number(args, "database_pool_size", str(DEFAULT_POOL_SIZE), int)),
            handler_modules=tuple(handlers),
            log_level=setting(args, "log_level", "info"),
            event_loop=setting(args, "event_loop", "asyncio"),
            remote_kinds=tuple(remote_kinds),
            worker_token=env("WORKER_TOKEN") or None,
            cancel_grace_seconds=optional_number(args, "cancel_grace_seconds"),
            steering=steering_rules,
            retention_seconds=_retention(args),
            metrics_listen=_metrics_listen(args, slot),
            metrics_kinds=tuple(words(args, "metrics_kinds", sep=True)),
            # Of `serve --processes`, the first serves the dashboard (its sessions are in memory).
            dashboard_listen=(setting(args, "dashboard_listen", "") or None)
            if not slot or slot.slot == 0
            else None,
            dashboard_allowed_hosts=tuple(words(args, "dashboard_allowed_hosts")),
            forwarded_allow_ips=tuple(words(args, "forwarded_allow_ips")),
            redact_error_messages=redact_requested(args),
            shutdown_grace_seconds=drain.shutdown_grace_seconds,
            watch_limits=drain.watch_limits,
            max_events_per_job=drain.max_events_per_job,
            connections=_connection_limits(args),
            owner_limits=drain.owner_limits,
            processes=processes,
            siblings=slot.siblings(processes) if slot is not None else None,
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


async def _serve(settings: Settings, registry: HandlerRegistry, slot: ProcessSlot | None) -> None:
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
    if slot is not None:
        structlog.contextvars.bind_contextvars(process=slot.slot)

        def on_supervisor_gone() -> None:
            # Its end of the pipe closed: nobody is left to stop this process.
            loop.remove_reader(slot.supervisor_fd)
            if not stop.is_set():
                log.warning("server.supervisor_gone", message="draining")
                stop.set()

        loop.add_reader(slot.supervisor_fd, on_supervisor_gone)
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


def main(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    """Run `leasehold serve` until a signal stops it; the process's exit status.
    `argv` is the command line after `leasehold`, which `--processes` repeats
    to start its children."""
    try:
        slot = ProcessSlot.parse(args.serve_process) if args.serve_process else None
        settings = settings_from(args, slot)
        _check_credentials(settings)
        configure_logging(settings.log_level, redact_error_messages=settings.redact_error_messages)
        if settings.processes > 1 and slot is None:
            _handlers(settings)  # a module that does not import fails here, once
            upgrade_schema(settings.database_url)
            return serve_processes.supervise(settings, argv)
        export = _tracing_export()
        _raise_descriptor_limit(settings)
        log.info("tracing.export", exporter=export.description)
        registry = _handlers(settings)
        if slot is None:  # the supervisor brought the schema up to date for its children
            upgrade_schema(settings.database_url)
        with (
            contextlib.suppress(KeyboardInterrupt),
            export,
            asyncio.Runner(loop_factory=_loop_factory(settings)) as runner,
        ):
            runner.run(_serve(settings, registry, slot))
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
    """Span export as the standard OTEL_* variables say (docs/tracing.md)."""
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

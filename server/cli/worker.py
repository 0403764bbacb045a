"""`leasehold worker`: run handler modules in this process for a remote server.

    leasehold worker --server HOST:PORT --handlers MODULE... [--concurrency N]
                     [--kinds KIND...] [--worker-id ID] [--log-level LEVEL]
                     [--tls-ca FILE [--tls-client-cert FILE --tls-client-key FILE]]

The worker token comes from LEASEHOLD_WORKER_TOKEN only, never a flag, so it
stays out of process listings and shell history; with a client certificate
(`serve --auth mtls`) none is needed. Like `serve`, every flag can
also come from the environment as LEASEHOLD_<FLAG>, a flag on the command line
wins, and a configuration mistake ends with one line naming the setting and exit
status 2. Its flags are declared in worker_flags.py, so that building the
parser imports nothing of what the worker runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from leasehold._server import tracing
from leasehold._server.app import load_handlers
from leasehold._server.defaults import DEFAULT_CONCURRENCY, env
from leasehold._server.gc_tuning import settle_after_startup
from leasehold._server.logs import configure_logging, redact_requested
from leasehold._server.remote.worker import Worker, WorkerRefused

log = structlog.get_logger("leasehold.worker")

EXIT_CONFIG = 2
LOG_LEVELS = ("debug", "info", "warning", "error")
# As `serve`: Ctrl-C ends the process within about 2 s. Running handlers get this
# long to finish; the rest are handed back (snoozed), so no job waits out a lease.
STOP_GRACE_SECONDS = 0.5


class WorkerConfigError(Exception):
    """A setting is wrong; the message names it."""


@dataclass(frozen=True)
class WorkerSettings:
    server: str
    handler_modules: tuple[str, ...]
    token: str | None
    concurrency: int = DEFAULT_CONCURRENCY
    kinds: tuple[str, ...] | None = None
    worker_id: str | None = None
    log_level: str = "info"
    redact_error_messages: bool = False
    tls_ca: str | None = None
    tls_client_cert: str | None = None
    tls_client_key: str | None = None


def main(args: argparse.Namespace) -> int:
    """Run `leasehold worker` until SIGINT or SIGTERM; the process's exit status."""
    try:
        settings = settings_from(args)
        worker = _worker(settings)
        # Only once every setting is known good: a mistake is one plain line.
        export = _tracing_export()
        configure_logging(settings.log_level, redact_error_messages=settings.redact_error_messages)
        log.info("tracing.export", exporter=export.description)
        with contextlib.suppress(KeyboardInterrupt), export, asyncio.Runner() as runner:
            runner.run(_work(worker))
    except (WorkerConfigError, WorkerRefused) as exc:
        print(f"leasehold: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _tracing_export() -> tracing.Export:
    """Span export as the standard OTEL_* variables say (docs/tracing.md)."""
    try:
        return tracing.export_from_environment(os.environ, "leasehold-worker")
    except ValueError as exc:
        raise WorkerConfigError(str(exc)) from None


def settings_from(args: argparse.Namespace) -> WorkerSettings:
    server = _setting(args, "server")
    if server is None:
        raise WorkerConfigError("server: give --server HOST:PORT or set LEASEHOLD_SERVER")
    handlers = _list(args, "handlers")
    if not handlers:
        raise WorkerConfigError("handlers: give --handlers MODULE... or set LEASEHOLD_HANDLERS")
    tls_ca, client_cert, client_key = (
        _setting(args, name) for name in ("tls_ca", "tls_client_cert", "tls_client_key")
    )
    if bool(client_cert) != bool(client_key):
        raise WorkerConfigError("tls_client_cert: --tls-client-cert and --tls-client-key go together")
    if client_cert and not tls_ca:
        raise WorkerConfigError("tls_ca: a client certificate needs --tls-ca (the server's CA)")
    token = env("WORKER_TOKEN")
    if token is None and not client_cert:
        raise WorkerConfigError(
            "LEASEHOLD_WORKER_TOKEN: must be set to the worker's token (or give --tls-client-cert)"
        )
    log_level = (_setting(args, "log_level") or "info").lower()
    if log_level not in LOG_LEVELS:
        raise WorkerConfigError(f"log_level: one of {', '.join(LOG_LEVELS)}")
    return WorkerSettings(
        server=server,
        handler_modules=handlers,
        token=token,
        concurrency=_integer(args, "concurrency", DEFAULT_CONCURRENCY),
        kinds=_list(args, "kinds") or None,
        worker_id=_setting(args, "worker_id"),
        log_level=log_level,
        redact_error_messages=redact_requested(args),
        tls_ca=tls_ca,
        tls_client_cert=client_cert,
        tls_client_key=client_key,
    )


def tls_credentials(settings: WorkerSettings) -> grpc.ChannelCredentials | None:
    """TLS trusting --tls-ca, presenting the client certificate when given;
    None for plaintext."""
    if settings.tls_ca is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read("tls_ca", settings.tls_ca),
        private_key=_read("tls_client_key", settings.tls_client_key) if settings.tls_client_key else None,
        certificate_chain=_read("tls_client_cert", settings.tls_client_cert)
        if settings.tls_client_cert
        else None,
    )


def _read(name: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise WorkerConfigError(f"{name}: cannot read {path}: {type(exc).__name__}") from None


def _worker(settings: WorkerSettings) -> Worker:
    try:
        registry = load_handlers(settings.handler_modules)
        return Worker(
            settings.server,
            registry,
            settings.token,
            concurrency=settings.concurrency,
            kinds=settings.kinds,
            worker_id=settings.worker_id,
            stop_grace_seconds=STOP_GRACE_SECONDS,
            credentials=tls_credentials(settings),
        )
    except ValueError as exc:  # both name the setting already
        raise WorkerConfigError(str(exc)) from None


async def _work(worker: Worker) -> None:
    """Run until a signal asks to stop; the stop itself is graceful (Worker.stop)."""
    loop = asyncio.get_running_loop()
    settle_after_startup()  # the handlers and grpc are imported by now
    run = asyncio.create_task(worker.run(), name="leasehold-worker")
    stopping: list[asyncio.Task[None]] = []

    def request_stop() -> None:
        if not stopping:
            log.info("worker.stop_requested", worker_id=worker.worker_id)
            stopping.append(loop.create_task(worker.stop(), name="leasehold-worker-stop"))

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, request_stop)
    await run
    if stopping:
        await stopping[0]


def _setting(args: argparse.Namespace, name: str) -> str | None:
    """The flag, else LEASEHOLD_<NAME>, else None."""
    value = getattr(args, name)
    return str(value) if value is not None else env(name.upper())


def _list(args: argparse.Namespace, name: str) -> tuple[str, ...]:
    """A many-valued flag, else LEASEHOLD_<NAME> split on spaces or commas."""
    values = getattr(args, name)
    if values is None:
        values = (env(name.upper()) or "").replace(",", " ").split()
    return tuple(values)


def _integer(args: argparse.Namespace, name: str, default: int) -> int:
    text = _setting(args, name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        source = (
            f"--{name.replace('_', '-')}" if getattr(args, name) is not None else f"LEASEHOLD_{name.upper()}"
        )
        raise WorkerConfigError(f"{source}: expected an integer, got {text!r}") from None

"""`leasehold serve` and `leasehold migrate`.

Every flag can also come from the environment as LEASEHOLD_<FLAG> (dashes become
underscores); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

import structlog

from server import migrate
from server.app import LeaseholdApp
from server.config import BUILTIN_HANDLERS, DEFAULT_DATABASE_URL, DEFAULT_LISTEN, Settings, env
from server.logs import configure_logging
from server.runtime.worker import RuntimeSettings

log = structlog.get_logger("leasehold.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leasehold", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gRPC service and its workers")
    _database_flag(serve)
    serve.add_argument("--listen", default=env("LISTEN") or DEFAULT_LISTEN, help="HOST:PORT")
    serve.add_argument("--concurrency", type=int, default=_env_int("CONCURRENCY", 2))
    serve.add_argument("--lease-seconds", type=float, default=_env_float("LEASE_SECONDS", 30.0))
    serve.add_argument("--poll-seconds", type=float, default=_env_float("POLL_SECONDS", 1.0))
    serve.add_argument(
        "--handlers",
        nargs="+",
        metavar="MODULE",
        default=(env("HANDLERS") or " ".join(BUILTIN_HANDLERS)).replace(",", " ").split(),
        help="modules defining register(registry); default: the built-in examples",
    )
    serve.add_argument("--log-level", default=env("LOG_LEVEL") or "info")

    migrate_cmd = commands.add_parser("migrate", help="bring the database schema up to date")
    _database_flag(migrate_cmd)
    return parser


def _database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=env("DATABASE_URL") or DEFAULT_DATABASE_URL,
        help=f"SQLAlchemy async URL (default {DEFAULT_DATABASE_URL})",
    )


def _env_int(name: str, default: int) -> int:
    value = env(name)
    try:
        return int(value) if value is not None else default
    except ValueError:
        raise SystemExit(f"LEASEHOLD_{name}: expected an integer, got {value!r}") from None


def _env_float(name: str, default: float) -> float:
    value = env(name)
    try:
        return float(value) if value is not None else default
    except ValueError:
        raise SystemExit(f"LEASEHOLD_{name}: expected a number, got {value!r}") from None


def _settings(args: argparse.Namespace) -> Settings:
    key = env("PAGE_TOKEN_KEY")
    extra = {"page_token_key": key.encode()} if key else {}
    return Settings(
        database_url=args.database_url,
        listen=args.listen,
        runtime=RuntimeSettings(
            concurrency=args.concurrency,
            lease_seconds=args.lease_seconds,
            poll_seconds=args.poll_seconds,
        ),
        handler_modules=tuple(args.handlers),
        log_level=args.log_level,
        **extra,
    )


async def _serve(settings: Settings) -> None:
    app = LeaseholdApp(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await app.start()
        await stop.wait()
        log.info("server.stopping")
    finally:
        await app.stop(grace_seconds=1.0)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "migrate":
            configure_logging()
            migrate.upgrade(args.database_url)
            log.info("migrate.done", database_url=_redacted(args.database_url))
            return 0
        settings = _settings(args)
    except ValueError as exc:
        print(f"leasehold: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(settings))
    return 0


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


if __name__ == "__main__":
    sys.exit(main())

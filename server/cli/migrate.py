"""`leasehold migrate`: bring the database schema up to date, as `serve` also
does before it starts. Imported only when one of them runs: SQLAlchemy and
alembic come in here."""

from __future__ import annotations

import argparse
import sys

import structlog
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from leasehold._server.cli.serve_flags import EXIT_CONFIG, ConfigError, setting
from leasehold._server.defaults import DEFAULT_DATABASE_URL
from leasehold._server.jobs.sql.engines import check_database_url
from leasehold._server.logs import configure_logging
from leasehold._server.migrate import upgrade

log = structlog.get_logger("leasehold.cli")


def main(args: argparse.Namespace) -> int:
    try:
        configure_logging()
        url = database_url(args)
        upgrade_schema(url)
        log.info("migrate.done", database_url=_redacted(url))
    except ConfigError as exc:
        print(f"leasehold: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def database_url(args: argparse.Namespace) -> str:
    url = setting(args, "database_url", DEFAULT_DATABASE_URL)
    try:
        check_database_url(url)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return url


def upgrade_schema(database_url: str) -> None:
    try:
        upgrade(database_url)
    except (SQLAlchemyError, OSError) as exc:
        cause = getattr(exc, "orig", None) or exc  # the driver's words, without SQLAlchemy's links
        # One line: libpq's messages span several.
        words = " ".join(str(cause).split())
        raise ConfigError(f"database_url: cannot migrate {_redacted(database_url)}: {words}") from None


def _redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)

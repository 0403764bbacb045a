"""From a database URL to the engines that serve it.

Writes go through a synchronous engine whose one connection the group-commit
writer holds on its own thread; reads go through SQLAlchemy async with a pool.
How each database sets these up is its dialect module's business
(`sqlite.py`, `postgres.py`); this module only finds the dialect a URL names.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

from leasehold._server.defaults import DEFAULT_POOL_SIZE
from leasehold._server.jobs.sql.dialect import DIALECT_MODULES, Engines, SqlDialect, dialect_named

# Names the write engine (in SQLAlchemy's logs, and for tests that aim faults at it).
WRITER_ENGINE_NAME = "leasehold-writer"

SQLITE_URL_HINT = "sqlite+aiosqlite:///PATH"
POSTGRES_URL_HINT = "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"

__all__ = ["DEFAULT_POOL_SIZE", "WRITER_ENGINE_NAME", "Engines", "create_engines", "parse_database_url"]


def _dialect_for(url: URL) -> SqlDialect:
    backend = url.get_backend_name()
    if backend not in DIALECT_MODULES:
        raise ValueError(
            f"database_url: unsupported database driver {url.drivername!r}; "
            f"use {SQLITE_URL_HINT} or {POSTGRES_URL_HINT}"
        )
    return dialect_named(backend)


def parse_database_url(database_url: str) -> URL:
    """The URL this service will use for `database_url`, or ValueError naming the
    setting."""
    try:
        url = make_url(database_url)
    except Exception:
        raise ValueError(f"database_url: not a database URL: {database_url!r}") from None
    return _dialect_for(url).check_url(url)


def check_database_url(database_url: str) -> None:
    """Raise ValueError naming `database_url` unless this service can use it."""
    parse_database_url(database_url)


def flavour_of(url: URL) -> str:
    """The dialect's name ("sqlite", "postgresql") of a parsed URL."""
    return _dialect_for(url).name


def create_engines(database_url: str, pool_size: int = DEFAULT_POOL_SIZE) -> Engines:
    url = parse_database_url(database_url)
    return _dialect_for(url).create_engines(url, pool_size)

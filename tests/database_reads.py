"""Direct, read-only looks at the database behind a service, on either engine:
what tests check beyond what the API shows (lease columns, every event log,
row counts).

SQLite files are opened read-only, so looking at a crashed file never
checkpoints or deletes its WAL and leaves it exactly as the crash did for the
next server to recover.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from leasehold._server.jobs.sql.engines import flavour_of, parse_database_url


def sync_url(database_url: str) -> URL:
    """The synchronous driver's URL for the service's `database_url`."""
    url = parse_database_url(database_url)
    if flavour_of(url) == "postgresql":
        return url
    return URL.create("sqlite", database=f"file:{url.database}?mode=ro", query={"uri": "true"})


def rows(database_url: str, statement: str, **parameters: Any) -> list[dict[str, Any]]:
    """The rows of one SQL statement (named parameters as `:name`)."""
    engine = sa.create_engine(sync_url(database_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            result = conn.execute(sa.text(statement), parameters)
            return [dict(row._mapping) for row in result]
    finally:
        engine.dispose()


def scalar(database_url: str, statement: str, **parameters: Any) -> Any:
    found = rows(database_url, statement, **parameters)
    assert len(found) == 1 and len(found[0]) == 1, found
    return next(iter(found[0].values()))


def json_column(value: Any) -> Any:
    """A JSON column's value: SQLite hands back the text, PostgreSQL the object."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def table_names(database_url: str) -> set[str]:
    engine = sa.create_engine(sync_url(database_url), poolclass=NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()

"""The reliability suite's figures: each experiment reports what it measured
(rounds, recovery times, counts) through the `figures` fixture, and the run ends
with one table of them, so the numbers quoted in a closing note come from a run
anyone can repeat with `python -m pytest tests/reliability`.

Experiments that run on both storage engines take the `database_url` fixture
(tests/conftest.py) for one database, or `new_database` here when they need
several or hand theirs to `leasehold serve` processes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from leasehold._server.jobs.sql.engines import flavour_of, parse_database_url
from tests.support import ENGINES, REPORTED_FIGURE, sqlite_url

if TYPE_CHECKING:
    from tests.conftest import Postgres

Figures = Callable[[str, Any], None]


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    """`figures(name, value)` records one figure under the test's name. It travels
    in the test's report (its user properties), so that the table (tests/conftest.py)
    is whole when the run's workers (pytest-xdist) each ran some of the experiments."""

    def record(name: str, value: Any) -> None:
        # Reports cross to the main process serialised: anything richer than a
        # number goes as the text the table shows.
        shown = value if isinstance(value, (int, float, str)) else str(value)
        request.node.user_properties.append((REPORTED_FIGURE, (name, shown)))

    return record


@dataclass(frozen=True)
class NewDatabase:
    """Makes fresh databases on one engine, for the experiments that need more
    than one (a round each) or hand theirs to `leasehold serve` processes.
    `new_database(directory)` is a SQLite file in `directory` (not yet migrated:
    `serve` migrates it), or a new database in the session's PostgreSQL cluster
    (already migrated; the directory then only holds the experiment's other
    files)."""

    engine: str
    make: Callable[[Path], str]
    # Removes a database made here, when a test makes many (SQLite: the directory
    # goes with the test's own files).
    discard: Callable[[str], None] = lambda _url: None

    def __call__(self, directory: Path) -> str:
        url = self.make(directory)
        # Never a silent fallback to the other engine.
        assert flavour_of(parse_database_url(url)) == self.engine, (self.engine, url)
        return url


@pytest.fixture(params=ENGINES)
def new_database(request: pytest.FixtureRequest) -> NewDatabase:
    """Parametrizes the test over both engines, as `database_url` does for one database."""
    if request.param == "sqlite":
        return NewDatabase("sqlite", sqlite_url)
    postgres: Postgres = request.getfixturevalue("postgres")

    def drop(url: str) -> None:
        name = make_url(url).database
        assert name is not None
        with postgres.cluster.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

    return NewDatabase("postgresql", lambda _directory: postgres.fresh_database_url(), drop)

"""The engine seam: every database is one module whose `SqlDialect` is complete,
and the shared SQL code never asks which database it is on."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from pathlib import Path

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from leasehold._server.jobs.routing import ANY_KIND, KindFilter, KindPatterns
from leasehold._server.jobs.sql import queue_view, statements
from leasehold._server.jobs.sql.dialect import DIALECT_MODULES, SqlDialect, dialect_named
from leasehold._server.jobs.sql.sqlite import LOCK_GAP_SECONDS, LockFairness

SQLALCHEMY_DIALECTS = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}


@pytest.mark.parametrize("name", sorted(DIALECT_MODULES))
def test_each_dialect_module_builds_a_complete_dialect_whose_statements_compile(name: str) -> None:
    dialect = dialect_named(name)

    assert dialect.name == name
    for field in dataclasses.fields(SqlDialect):
        assert getattr(dialect, field.name) is not None, field.name
    remote = KindPatterns.parse(["media.*", "pdf.render"])
    shapes = (ANY_KIND, KindFilter(excluding=remote), KindFilter(only=frozenset()))
    for statement in (
        *(queue_view.owners_with_due(shape, bounded) for shape in shapes for bounded in (False, True)),
        *(queue_view.claim_probe(shape) for shape in shapes),
        *(
            queue_view.heads(shape, blocking, members, dialect.locks_rows)
            for shape in shapes
            for blocking in (False, True)
            for members in (1, 4)
        ),
        dialect.claim_chosen,
        dialect.upsert_bucket,
        dialect.recover_expired,
        dialect.end_overdue,
        dialect.insert_if_new,
        dialect.insert_request_id,
        dialect.insert_paused_kind,
        *(getattr(dialect.many_leases, f.name) for f in dataclasses.fields(dialect.many_leases)),
    ):
        assert str(statement.compile(dialect=SQLALCHEMY_DIALECTS[name]))


def test_a_dialect_missing_a_piece_cannot_even_be_built() -> None:
    """So a new engine's module that forgets one fails when it is imported, at
    start-up, not with a KeyError in the middle of a request."""
    sqlite_dialect = dialect_named("sqlite")
    complete = {field.name: getattr(sqlite_dialect, field.name) for field in dataclasses.fields(SqlDialect)}
    del complete["change_feed"]

    with pytest.raises(TypeError, match="change_feed"):
        SqlDialect(**complete)


SQL_PACKAGE = Path(statements.__file__).parent
# Only these may know which database they are on: the two dialect modules;
# dialect.py, the registry that maps a database's name to its module; and
# engines.py, which reads that name from a URL to load it.
KNOWS_ITS_DATABASE = {"sqlite.py", "postgres.py", "dialect.py", "engines.py"}
DATABASE_NAMES = {"sqlite", "postgresql", "postgres"}


def database_questions(source: str) -> list[str]:
    """Where `source` asks which database it is on: by a dialect's or URL's
    name, by comparing with a database's name, or by importing SQLAlchemy's
    code for one database. A database's name is allowed only as the key of
    SQLAlchemy's own per-database dispatch (`@compiles`, `with_variant`)."""
    tree = ast.parse(source)
    dispatch_keys = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "compiles")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "with_variant")
        )
        for arg in node.args
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in DATABASE_NAMES and id(node) not in dispatch_keys:
            found.append(f"line {node.lineno}: the name {node.value!r}")
        elif isinstance(node, ast.Attribute) and (
            node.attr in {"flavour", "drivername", "get_backend_name"}
            or (node.attr == "name" and ast.unparse(node.value).endswith("dialect"))
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Name) and node.id in {"DIALECT_MODULES", "dialect_named", "flavour_of"}:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [
                f"{node.module}.{a.name}" if isinstance(node, ast.ImportFrom) else a.name for a in node.names
            ]
            if any(m.startswith("sqlalchemy.dialects.") for m in modules):
                found.append(f"line {node.lineno}: import of {', '.join(modules)}")
    return found


@pytest.mark.parametrize(
    "path",
    sorted(p for p in SQL_PACKAGE.glob("*.py") if p.name not in KNOWS_ITS_DATABASE),
    ids=lambda p: p.name,
)
def test_shared_sql_code_never_asks_which_database_it_is_on(path: Path) -> None:
    assert database_questions(path.read_text()) == []


@pytest.mark.parametrize(
    "branch",
    [
        'upsert = postgresql.insert if dialect.name == "postgresql" else sqlite.insert',
        "from sqlalchemy.dialects import postgresql",
        "from sqlalchemy.dialects.sqlite import insert",
        "import sqlalchemy.dialects.postgresql",
        "on_postgres = self._dialect.name == NAME",
        "on_sqlite = engines.flavour == WANTED",
        'if database in {"sqlite"}: pass',
        "backend = url.get_backend_name()",
        "chosen = dialect_named(backend)",
    ],
)
def test_the_guard_sees_a_branch_on_the_database(branch: str) -> None:
    """Each way of asking, put back into the module that used to ask."""
    source = (SQL_PACKAGE / "admin.py").read_text()

    assert database_questions(source + "\n" + branch + "\n")


class FakeTime:
    """A monotonic clock that moves only when told to, and a sleep that records."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_sqlite_leaves_its_write_lock_free_after_holding_it_most_of_a_window() -> None:
    time = FakeTime()
    pacing = LockFairness(monotonic=time.monotonic, sleep=time.sleep)
    for _ in range(30):  # back-to-back batches, 0.1 s each, no idle gap
        await pacing.before_batch(idle_seconds=0.0)
        time.now += 0.1
        pacing.after_batch(0.1)

    assert time.slept == [LOCK_GAP_SECONDS]  # once, after the first 2.5 s window


async def test_sqlite_does_not_pause_a_writer_that_leaves_gaps_on_its_own() -> None:
    time = FakeTime()
    pacing = LockFairness(monotonic=time.monotonic, sleep=time.sleep)
    for _ in range(30):
        await pacing.before_batch(idle_seconds=0.01)
        time.now += 0.1
        pacing.after_batch(0.02)  # held a fifth of the time

    assert time.slept == []


async def test_postgresql_never_pauses_its_writer() -> None:
    pacing = dialect_named("postgresql").pacing()
    pacing.after_batch(3600.0)

    await asyncio.wait_for(pacing.before_batch(idle_seconds=0.0), timeout=1)  # returns at once

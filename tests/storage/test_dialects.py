"""The engine seam: every database is one module whose `SqlDialect` is complete,
and the shared SQL code never asks which database it is on."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from leasehold._server.jobs.routing import ANY_KIND, KindFilter, KindPatterns
from leasehold._server.jobs.sql import queue_view, repository, statements, transitions, writer
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
        *(queue_view.due_priorities(shape) for shape in shapes),
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


@pytest.mark.parametrize(
    "module", [repository, statements, transitions, writer, queue_view], ids=lambda m: m.__name__
)
def test_shared_sql_code_never_branches_on_the_database(module: object) -> None:
    source = inspect.getsource(module)  # type: ignore[arg-type]
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines())

    assert not re.search(r"dialect\.name|\.flavour|[\"'](sqlite|postgresql)[\"']", code)


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

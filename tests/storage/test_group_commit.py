"""The group-commit writer: operations queued together share one transaction, and
one operation's failure is that operation's alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy import Connection, text

from leasehold._server import migrate
from leasehold._server.jobs.errors import StorageClosed
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.writer import GroupCommitWriter, OpGroup, WriteTx
from tests.support import sqlite_url


class Refused(Exception):
    pass


@pytest.fixture
async def writer(tmp_path: Path) -> AsyncIterator[GroupCommitWriter]:
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    engines = create_engines(url)
    with engines.writer.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE scratch (item TEXT NOT NULL)")
    writer = GroupCommitWriter(engines.writer, ChangeHub(), engines.dialect)
    try:
        yield writer
    finally:
        await writer.close()
        await engines.dispose()


def _stored(writer: GroupCommitWriter) -> list[str]:
    with writer._engine.connect() as conn:
        return sorted(row.item for row in conn.execute(text("SELECT item FROM scratch")))


def _insert_all(tx: WriteTx, items: list[str]) -> list[str | Exception]:
    """Writes every item, then fails the whole call if any item is bad, the way a
    constraint violation would fail one multi-row statement."""
    for item in items:
        tx.conn.execute(text("INSERT INTO scratch VALUES (:item)"), {"item": item})
    if any(item.startswith("bad") for item in items):
        raise Refused(",".join(items))
    return [f"stored {item}" for item in items]


async def test_a_group_runs_once_for_every_item_queued_together(writer: GroupCommitWriter) -> None:
    calls: list[list[str]] = []

    def counted(tx: WriteTx, items: list[str]) -> list[str | Exception]:
        calls.append(items)
        return _insert_all(tx, items)

    group = OpGroup("counted", counted)
    results = await asyncio.gather(*(writer.run_grouped(group, f"item{i}") for i in range(20)))

    assert results == [f"stored item{i}" for i in range(20)]
    assert sorted(item for call in calls for item in call) == sorted(f"item{i}" for i in range(20))
    assert len(calls) < 20  # queued together, run together
    assert _stored(writer) == sorted(f"item{i}" for i in range(20))


async def test_a_failing_group_is_split_so_only_the_bad_item_fails(writer: GroupCommitWriter) -> None:
    def plain(tx: WriteTx) -> str:
        tx.conn.execute(text("INSERT INTO scratch VALUES ('plain')"))
        return "plain done"

    calls: list[list[str]] = []

    def recorded(tx: WriteTx, items: list[str]) -> list[str | Exception]:
        calls.append(items)
        return _insert_all(tx, items)

    group = OpGroup("recorded", recorded)
    pending = [writer.run_grouped(group, item) for item in ("a", "bad", "b", "c")]
    results = await asyncio.gather(*pending, writer.run(plain), return_exceptions=True)

    assert calls[0] == ["a", "bad", "b", "c"]  # tried together first, then one by one
    assert results[0] == "stored a"
    assert isinstance(results[1], Refused) and str(results[1]) == "bad"
    assert results[2:] == ["stored b", "stored c", "plain done"]
    assert _stored(writer) == ["a", "b", "c", "plain"]


async def test_a_batch_in_which_nothing_fails_sends_no_savepoint(writer: GroupCommitWriter) -> None:
    """A savepoint per operation is two statements each (two round trips on
    PostgreSQL): only a batch that needs one, because an operation failed,
    is run again with them, and every other operation's write lands once."""
    sent: list[str] = []

    def capture(statement: str) -> None:
        sent.append(statement.split()[0].upper())

    def trace(conn: Connection) -> None:
        # The driver's own trace: savepoints go to it directly, past SQLAlchemy.
        conn.connection.driver_connection.set_trace_callback(capture)  # type: ignore[union-attr]

    def plain(name: str) -> Callable[[WriteTx], str]:
        def op(tx: WriteTx) -> str:
            tx.conn.execute(text("INSERT INTO scratch VALUES (:item)"), {"item": name})
            if name == "bad":
                raise Refused(name)
            return f"{name} done"

        return op

    await writer.on_connection(trace)
    quiet = await asyncio.gather(*(writer.run(plain(f"q{i}")) for i in range(10)))
    quiet_sent, sent[:] = list(sent), []
    mixed = await asyncio.gather(
        *(writer.run(plain(name)) for name in ("m1", "bad", "m2")), return_exceptions=True
    )

    assert quiet == [f"q{i} done" for i in range(10)]
    assert quiet_sent.count("INSERT") == 10 and "SAVEPOINT" not in quiet_sent
    assert mixed[0] == "m1 done" and isinstance(mixed[1], Refused) and mixed[2] == "m2 done"
    assert sent.count("SAVEPOINT") == 3  # the second run, one per operation
    assert _stored(writer) == sorted(["m1", "m2", *(f"q{i}" for i in range(10))])


async def test_an_answer_that_is_an_exception_reaches_only_its_caller(writer: GroupCommitWriter) -> None:
    def odd_ones_refused(tx: WriteTx, items: list[int]) -> list[str | Exception]:
        return [Refused(str(i)) if i % 2 else f"ok {i}" for i in items]

    group = OpGroup("odd", odd_ones_refused)
    results = await asyncio.gather(*(writer.run_grouped(group, i) for i in range(6)), return_exceptions=True)

    assert [r if isinstance(r, str) else type(r) for r in results] == [
        "ok 0",
        Refused,
        "ok 2",
        Refused,
        "ok 4",
        Refused,
    ]


async def test_a_close_cut_short_still_answers_the_callers_of_the_batch_in_hand(
    writer: GroupCommitWriter,
) -> None:
    """A shutdown deadline may cancel close(); the batch already on the writer
    thread commits regardless, so its caller must still get its answer."""
    started, release = threading.Event(), threading.Event()

    def slow(tx: WriteTx) -> str:
        tx.conn.execute(text("INSERT INTO scratch VALUES ('slow')"))
        started.set()
        release.wait(30)  # held until close() has been cut short, however slow the machine
        return "slow done"

    caller = asyncio.create_task(writer.run(slow))
    await asyncio.to_thread(started.wait, 5)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(writer.close(), 0.05)
    release.set()

    assert await asyncio.wait_for(caller, 5) == "slow done"
    assert _stored(writer) == ["slow"]


async def test_close_twice_is_harmless_and_writes_after_it_are_refused(writer: GroupCommitWriter) -> None:
    await writer.run(lambda tx: tx.conn.execute(text("INSERT INTO scratch VALUES ('x')")).rowcount)
    await writer.close()
    await writer.close()

    with pytest.raises(StorageClosed):
        await writer.run(lambda tx: None)

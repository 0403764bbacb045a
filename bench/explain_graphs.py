"""`python -m bench.explain_graphs`: the plan of every statement a graph's release sends, on
SQLite and on PostgreSQL, against a realistic database.

    python -m bench.explain_graphs [--jobs 100000] [--no-postgres] [--postgres-url URL] [--keep DIR]

Each statement of `leasehold._server.jobs.sql.graphs` (LOCK_PARENTS, INSERT_EDGES,
WAITING_CHILDREN, write_children, PARENT_RESULTS, CHILD_IDS) and retention's four "which jobs have
expired" statements (`_EXPIRED_UNKEYED`, `_EXPIRED_KEYED`, and the two graphs added for
parents) is executed through SQLAlchemy on a connection of the real dialect with the real
parameters, exactly as the server's writer would send it (on PostgreSQL the variants a row-locking
database gets: WAITING_CHILDREN ... FOR UPDATE OF jobs, the expired statements FOR UPDATE SKIP
LOCKED), except that a connection event puts EXPLAIN in front of the SQL text on its way to the
driver, with the same parameters:

* SQLite: `EXPLAIN QUERY PLAN`, twice: first as `serve` leaves the file (it never runs ANALYZE,
  so the planner has no statistics), then after ANALYZE; each with the statement's own time
  (the median of 5 executions, each in a transaction rolled back);
* PostgreSQL (after VACUUM ANALYZE): `EXPLAIN (ANALYZE, BUFFERS)`, each inside a transaction
  that is rolled back, so the statement runs (and locks) and leaves nothing behind; once as a
  one-off statement (a custom plan for these values), and once as a prepared statement under
  `plan_cache_mode = force_generic_plan`, which is the plan psycopg's prepared statements (after
  five executions of the same text on a connection) may settle on;
* PostgreSQL, before that: the plans a long-lived connection (the server's writer) caches for
  its prepared statements while the tables are still small. Each statement is prepared on one
  session of a database of a few dozen jobs and run six times there (so PostgreSQL weighs and
  keeps a generic plan, as it does for psycopg's prepared statements), then the database is
  seeded (autovacuum held off on its tables meanwhile: its ANALYZE would invalidate the
  cached plans, which is the only thing that does), and the cached plans are EXPLAINed
  (ANALYZE) with the real parameters.

The database is migrated, then seeded through `SqlJobRepository` with `--jobs` jobs (100,000 by
default) of one owner and 10,000 edges: 50 diamonds of 100 (1 root, running; 98 middle jobs
waiting for it; 1 sink waiting for all 98: 9,800 edges, 4,950 waiting jobs); 100 parent/child
pairs that both finished 30 days ago (retention may delete them; one parent in ten has a
resource key); 100 parents that finished 30
days ago whose child is still queued (released, but not due for 300 days: retention must keep
the parent); 10,000 queued due jobs; and the rest finished jobs, half 30 days ago, half an hour
ago, one in ten with a resource key of its own.

Each plan is followed by a verdict: `seek` when every step reaches its rows through an index by
the statement's own input (a job id, a parent id), `range` for retention's designed walk of the
expired range, and `SCAN` (flagged) for a full scan, or for a step that reaches rows by a key
that is not the statement's input (e.g. every queued job by status) and so grows with the table
rather than with the statement's input.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg.sql import Literal
from sqlalchemy import Engine, create_engine, event, text, update
from sqlalchemy.engine import Connection

from bench.common import OWNER, sqlite_url
from bench.seed import sync_url
from leasehold._server import migrate
from leasehold._server.clock import SystemClock
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.operations.graphs import RELEASED_COLUMNS
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql import graphs, postgres, retention
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.sql.tables import jobs
from leasehold._server.logs import configure_logging
from leasehold._server.runtime.retention import RETENTION_BATCH

DIAMONDS = 50
DIAMOND_SIZE = 100
OLD_PAIRS = 100
KEPT_PAIRS = 100
BACKLOG = 10_000
CHUNK = 1_000
WORKER = "explain-seeder"
RETENTION_DAYS = 7
AGE = timedelta(days=30)
KEYED = 10


# ----- the realistic database ---------------------------------------------------------------------


@dataclass
class Seeded:
    """Ids the statements are given."""

    roots: list[str] = field(default_factory=list)
    middles: list[str] = field(default_factory=list)  # the first diamond's
    sink: str = ""
    backlog_job: str = ""


async def seed(url: str, total: int) -> Seeded:
    configure_logging("warning")
    await asyncio.to_thread(migrate.upgrade, url)
    repo = SqlJobRepository(create_engines(url), SystemClock())
    seeded = Seeded()

    def only(kind: str) -> KindFilter:
        return KindFilter(only=frozenset({kind}))

    async def claim_and_succeed(kind: str, count: int) -> None:
        claimed = (await repo.claim(WORKER, count, 3600, only(kind))).jobs
        assert len(claimed) == count, (kind, len(claimed), count)
        for one in claimed:
            await repo.succeed_status(one.lease)

    try:
        # 50 diamonds: the roots running, everything else waiting.
        per_call = CHUNK // DIAMOND_SIZE
        for first in range(0, DIAMONDS, per_call):
            items: list[NewJob] = []
            for _ in range(first, min(DIAMONDS, first + per_call)):
                base = len(items)
                items.append(NewJob(OWNER, "graph.root", {}))
                middles = range(base + 1, base + DIAMOND_SIZE - 1)
                items.extend(NewJob(OWNER, "graph.step", {}, depends_on_items=(base,)) for _ in middles)
                items.append(NewJob(OWNER, "graph.step", {}, depends_on_items=tuple(middles)))
            answers = await repo.enqueue_batch(items)
            if first == 0:
                seeded.middles = [job.id for job, _ in answers[1 : DIAMOND_SIZE - 1]]
                seeded.sink = answers[DIAMOND_SIZE - 1][0].id
        claimed = (await repo.claim(WORKER, DIAMONDS, 3600, only("graph.root"))).jobs
        assert len(claimed) == DIAMONDS
        seeded.roots = sorted(one.job.id for one in claimed)
        # Parents (and children) that finished long ago, one parent in KEYED with a resource key;
        # parents whose child is still to run.
        pairs: list[NewJob] = []
        for i in range(OLD_PAIRS):
            key = f"graph.old-{i}" if i % KEYED == 0 else ""
            pairs += [
                NewJob(OWNER, "graph.old", {}, resource_type="document" if key else "", resource_id=key),
                NewJob(OWNER, "graph.old-child", {}, depends_on_items=(2 * i,)),
            ]
        await repo.enqueue_batch(pairs)
        await claim_and_succeed("graph.old", OLD_PAIRS)
        await claim_and_succeed("graph.old-child", OLD_PAIRS)
        later = datetime.now(UTC) + timedelta(days=300)
        pairs = []
        for i in range(KEPT_PAIRS):
            pairs += [
                NewJob(OWNER, "graph.kept", {}),
                NewJob(OWNER, "graph.kept-child", {}, run_at=later, depends_on_items=(2 * i,)),
            ]
        await repo.enqueue_batch(pairs)
        await claim_and_succeed("graph.kept", KEPT_PAIRS)
        # The queue, and the history.
        history = total - DIAMONDS * DIAMOND_SIZE - 2 * OLD_PAIRS - 2 * KEPT_PAIRS - BACKLOG
        for kind, count in (
            ("bench.noop", BACKLOG),
            ("history.old", history // 2),
            ("history.recent", history - history // 2),
        ):
            for start in range(0, count, CHUNK):
                answers = await repo.enqueue_batch(
                    [_history_job(kind, i) for i in range(start, min(count, start + CHUNK))]
                )
                seeded.backlog_job = seeded.backlog_job or answers[0][0].id
    finally:
        await repo.close()
    await asyncio.to_thread(_age, url)
    return seeded


def _history_job(kind: str, i: int) -> NewJob:
    """One job of the queue or of the history; one finished job in KEYED has a resource key."""
    if kind != "bench.noop" and i % KEYED == 0:
        return NewJob(OWNER, kind, {"n": i}, resource_type="document", resource_id=f"{kind}-{i}")
    return NewJob(OWNER, kind, {"n": i})


def _age(url: str) -> None:
    """Finish the history as claim and succeed would have (only older), and age what finished
    long ago."""
    now = datetime.now(UTC)
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            for kind, age in (("history.old", AGE), ("history.recent", timedelta(hours=1))):
                at = now - age
                conn.execute(
                    update(jobs)
                    .where(jobs.c.kind == kind)
                    .values(status="succeeded", attempt=1, started_at=at, completed_at=at, updated_at=at)
                )
            conn.execute(
                update(jobs)
                .where(jobs.c.kind.in_(["graph.old", "graph.old-child", "graph.kept"]))
                .values(completed_at=now - AGE, updated_at=now - AGE)
            )
    finally:
        engine.dispose()


# ----- the statements and their parameters --------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    statement: Callable[[bool], Any]  # locks_rows -> statement
    params: dict[str, Any]
    inputs: frozenset[str]  # the columns a seek by the statement's input uses
    walks_range: bool = False  # retention: a designed range over expired jobs
    # The server plans it afresh in its transaction (`SqlDialect.plan_afresh`).
    planned_afresh: bool = False


def _expired_statement(index: int) -> Callable[[bool], Any]:
    return lambda locks: retention.EXPIRED[locks][index]


def cases(seeded: Seeded) -> list[Case]:
    now = datetime.now(UTC)
    root = seeded.roots[0]
    released = {
        "id": seeded.middles[0],
        "status": sm.QUEUED.value,
        "available_at": now,
        "completed_at": None,
        "error_message": None,
        "error_type": None,
        "pending_dependencies": 0,
        "last_event_sequence": 2,
        "updated_at": now,
    }
    expired = {"cutoff": now - timedelta(days=RETENTION_DAYS), "limit": RETENTION_BATCH}
    ids = frozenset({"id"})
    return [
        Case(
            "LOCK_PARENTS",
            "an Enqueue naming 2 running parents",
            lambda _: graphs.LOCK_PARENTS,
            {"owner": OWNER, "ids": seeded.roots[:2]},
            ids,
            planned_afresh=True,
        ),
        Case(
            "INSERT_EDGES",
            "one edge (the foreign key checks the child)",
            lambda _: graphs.INSERT_EDGES,
            {"parent_id": root, "child_id": seeded.backlog_job},
            frozenset({"id", "child_id", "parent_id"}),
        ),
        Case(
            "WAITING_CHILDREN (fan-out)",
            "a root ending: its 98 waiting children",
            lambda locks: graphs.WAITING_CHILDREN[locks],
            {"ids": [root]},
            frozenset({"parent_id", "id"}),
            planned_afresh=True,
        ),
        Case(
            "WAITING_CHILDREN (fan-in)",
            "10 middle jobs ending in one commit: their one sink, 10 times",
            lambda locks: graphs.WAITING_CHILDREN[locks],
            {"ids": sorted(seeded.middles[:10])},
            frozenset({"parent_id", "id"}),
            planned_afresh=True,
        ),
        Case(
            "write_children (released)",
            "one child released",
            lambda _: graphs.write_children(RELEASED_COLUMNS),
            graphs.child_parameters(released, RELEASED_COLUMNS),
            ids,
        ),
        Case(
            "PARENT_RESULTS",
            "a sink's claim: its 98 parents' results",
            lambda _: graphs.PARENT_RESULTS,
            {"ids": sorted(seeded.middles)},
            ids,
            planned_afresh=True,
        ),
        Case(
            "CHILD_IDS",
            "List's depends_on filter: a root's children",
            lambda _: graphs.CHILD_IDS,
            {"parent": root},
            frozenset({"parent_id"}),
        ),
        *(
            Case(
                f"retention {name}",
                f"a sweep's batch ({RETENTION_BATCH}), cutoff {RETENTION_DAYS} days",
                _expired_statement(i),
                expired,
                frozenset({"id", "parent_id", "owner_id"}),
                walks_range=True,
                planned_afresh=True,
            )
            for i, name in enumerate(
                ("_EXPIRED_UNKEYED", "_EXPIRED_KEYED", "_EXPIRED_PARENTS_UNKEYED", "_EXPIRED_PARENTS_KEYED")
            )
        ),
    ]


# ----- EXPLAIN through the real dialect -----------------------------------------------------------


def explained(
    conn: Connection,
    statement: Any,
    params: dict[str, Any],
    rewrite: Callable[[Any, str, Any], tuple[str, Any]],
) -> tuple[str, list[tuple[Any, ...]]]:
    """Execute `statement` with `params` on `conn`, with `rewrite(cursor, sql, parameters)` turning
    the driver's SQL into its EXPLAIN; returns the SQL as the driver got it and the plan rows."""
    sent: list[str] = []
    rows: list[tuple[Any, ...]] = []

    def before(
        _conn: Any, cursor: Any, sql: str, parameters: Any, _context: Any, _many: bool
    ) -> tuple[str, Any]:
        sent.append(sql)
        return rewrite(cursor, sql, parameters)

    def after(_conn: Any, cursor: Any, *_: Any) -> None:
        if cursor.description is not None:  # a statement that answers rows (an EXPLAIN does)
            rows.extend(tuple(row) for row in cursor.fetchall())

    event.listen(conn, "before_cursor_execute", before, retval=True)
    event.listen(conn, "after_cursor_execute", after)
    try:
        conn.execute(statement, params).close()
    finally:
        event.remove(conn, "before_cursor_execute", before)
        event.remove(conn, "after_cursor_execute", after)
    return sent[0], rows


def _prefix(text_: str) -> Callable[[Any, str, Any], tuple[str, Any]]:
    return lambda _cursor, sql, parameters: (text_ + sql, parameters)


_PYFORMAT = re.compile(r"%\((\w+)\)s")


def _generic(cursor: Any, sql: str, parameters: Any) -> tuple[str, Any]:
    """PREPARE the statement (its %(name)s markers as $n), then EXPLAIN the EXECUTE of it."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    cursor.execute("DEALLOCATE ALL")
    cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    cursor.execute("PREPARE explained AS " + _PYFORMAT.sub(number, sql).replace("%%", "%"))
    # The arguments as literals: EXECUTE cannot type a parameter that psycopg sends untyped.
    arguments = ", ".join(Literal(parameters[name]).as_string(cursor) for name in names)
    return f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE explained({arguments})", {}


def shown_sql(sql: str) -> str:
    """The SQL, its long runs of parameter markers shortened."""
    sql = re.sub(
        r"(?:(?:\?|%\(\w+\)s), ){3,}(?:\?|%\(\w+\)s)",
        lambda m: f"{m.group(0).split(', ')[0]}, ... ({m.group(0).count(', ') + 1} values)",
        sql,
    )
    return re.sub(r"\s+", " ", sql).strip()


# ----- verdicts -----------------------------------------------------------------------------------


_SQLITE_KEY = re.compile(r"\((.*)\)\s*$")
_PG_COND = re.compile(r"(?:Index Cond|Recheck Cond): (.*)")


def sqlite_verdict(case: Case, details: list[str]) -> tuple[str, list[str]]:
    flags: list[str] = []
    first_search = True
    for detail in details:
        if detail.startswith("SCAN "):
            flags.append(f"full scan: {detail}")
        elif detail.startswith("SEARCH "):
            if case.walks_range and first_search and "completed_at<" not in detail:
                flags.append(f"retention's walk is not on the expired range (status, completed_at): {detail}")
            first_search = False
            key = _SQLITE_KEY.search(detail)
            columns = {
                part.split("=")[0].split("<")[0].split(">")[0].strip()
                for part in (key.group(1) if key else "").split(" AND ")
            }
            if not columns & case.inputs and not case.walks_range:
                flags.append(f"reaches rows by {sorted(columns)}, not by the statement's input: {detail}")
    if flags:
        return "SCAN", flags
    return ("range" if case.walks_range else "seek"), flags


def pg_verdict(case: Case, lines: list[str]) -> tuple[str, list[str]]:
    flags: list[str] = []
    first_scan = True
    for index, line in enumerate(lines):
        stripped = line.strip().lstrip("->").strip()
        if stripped.startswith("Seq Scan"):
            ran = "" if "never executed" in stripped else " (executed)"
            flags.append(f"full scan{ran}: {stripped}")
        elif re.match(r"(Index Scan|Index Only Scan|Bitmap Index Scan)", stripped):
            conds = [m.group(1) for follow in lines[index + 1 : index + 4] if (m := _PG_COND.search(follow))]
            cond = conds[0] if conds else ""
            outer = not re.search(r" on jobs (sibling|child)\b", stripped)  # not a subquery's alias
            if case.walks_range and first_scan and outer and "completed_at" not in cond:
                flags.append(
                    f"retention's walk is not on the expired range (status, completed_at): {stripped}"
                )
            first_scan = first_scan and not outer
            if (
                cond
                and not any(re.search(rf"\b{column}\b", cond) for column in case.inputs)
                and not case.walks_range
            ):
                flags.append(f"reaches rows by ({cond}), not by the statement's input: {stripped}")
    if flags:
        return "SCAN", flags
    return ("range" if case.walks_range else "seek"), flags


# ----- the two databases --------------------------------------------------------------------------


def _timed(engine: Engine, statement: Any, params: dict[str, Any], repeats: int = 5) -> float:
    """The median time of `statement` in ms, each execution in a transaction rolled back."""
    times: list[float] = []
    with engine.connect() as conn:
        for _ in range(repeats):
            began = time.perf_counter()
            result = conn.execute(statement, params)
            if result.returns_rows:
                result.fetchall()
            times.append((time.perf_counter() - began) * 1000)
            conn.rollback()
    return sorted(times)[len(times) // 2]


def report_sqlite(engine: Engine, all_cases: Sequence[Case], title: str) -> Iterator[str]:
    yield f"=== SQLite {engine.dialect.server_version_info}: {title} ==="
    for case in all_cases:
        with engine.connect() as conn:
            sql, rows = explained(conn, case.statement(False), case.params, _prefix("EXPLAIN QUERY PLAN "))
            conn.rollback()
        details = [str(row[3]) for row in rows]
        took = _timed(engine, case.statement(False), case.params)
        verdict, flags = sqlite_verdict(case, details)
        yield f"\n-- {case.name}: {case.what}  [{verdict}, {took:.3f} ms]"
        yield f"   {shown_sql(sql)}"
        yield from (f"   | {detail}" for detail in details or ["(no table access: a plain insert of VALUES)"])
        yield from (f"   ! {flag}" for flag in flags)


def report_postgres(engine: Engine, all_cases: Sequence[Case]) -> Iterator[str]:
    with engine.connect() as conn:
        version = conn.execute(text("SHOW server_version")).scalar()
    yield f"=== PostgreSQL {version}: after VACUUM ANALYZE; EXPLAIN (ANALYZE, BUFFERS), rolled back ==="
    for case in all_cases:
        for label, rewrite in (
            ("custom plan", _prefix("EXPLAIN (ANALYZE, BUFFERS) ")),
            ("generic plan", _generic),
        ):
            with engine.connect() as conn:
                sql, rows = explained(conn, case.statement(True), case.params, rewrite)
                conn.rollback()
            lines = [str(row[0]) for row in rows]
            verdict, flags = pg_verdict(case, lines)
            yield f"\n-- {case.name}: {case.what} ({label})  [{verdict}]"
            if label == "custom plan":
                yield f"   {shown_sql(sql)}"
            yield from (f"   | {line}" for line in lines)
            yield from (f"   ! {flag}" for flag in flags)


def run_sqlite(directory: Path, total: int) -> Iterator[str]:
    path = directory / "explain-graphs.db"
    began = time.monotonic()
    seeded = asyncio.run(seed(sqlite_url(path), total))
    yield f"(SQLite: seeded {total} jobs in {time.monotonic() - began:.0f} s: {path})"
    engine = create_engine(sync_url(sqlite_url(path)))
    try:
        with engine.connect() as conn:
            stats = conn.execute(
                text("SELECT count(*) FROM sqlite_master WHERE name LIKE 'sqlite_stat%'")
            ).scalar()
        all_cases = cases(seeded)
        yield from report_sqlite(engine, all_cases, f"as `serve` leaves the file ({stats} statistics tables)")
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        yield ""
        yield from report_sqlite(engine, all_cases, "after ANALYZE")
    finally:
        engine.dispose()


# ----- PostgreSQL: generic plans cached while the tables were small ------------------------------

_GRAPH_TABLES = ("jobs", "job_dependencies", "job_events")
_WARM_RUNS = 6  # psycopg prepares a statement at its 5th run; PostgreSQL then weighs a generic plan


def _literals(cursor: Any, sql: str, parameters: Any) -> tuple[list[str], str]:
    """The statement's %(name)s markers as $n, and its arguments as literals in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = _PYFORMAT.sub(number, sql).replace("%%", "%")
    return [Literal(parameters[name]).as_string(cursor) for name in names], numbered


def _prepare_and_warm(name: str) -> Callable[[Any, str, Any], tuple[str, Any]]:
    """PREPARE the statement as `name` on this session and run it as the server's connection
    would, until PostgreSQL has weighed a generic plan for it (an INSERT only prepared: its plan
    is a plain insert, and fake ids would break its foreign key)."""

    def rewrite(cursor: Any, sql: str, parameters: Any) -> tuple[str, Any]:
        arguments, numbered = _literals(cursor, sql, parameters)
        cursor.execute(f"PREPARE {name} AS {numbered}")
        if sql.lstrip().upper().startswith("INSERT"):
            return "SELECT 1", {}
        for _ in range(_WARM_RUNS - 1):
            cursor.execute(f"EXECUTE {name}({', '.join(arguments)})")
        return f"EXECUTE {name}({', '.join(arguments)})", {}

    return rewrite


def _explain_prepared(name: str) -> Callable[[Any, str, Any], tuple[str, Any]]:
    def rewrite(cursor: Any, sql: str, parameters: Any) -> tuple[str, Any]:
        arguments, _ = _literals(cursor, sql, parameters)
        return f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE {name}({', '.join(arguments)})", {}

    return rewrite


def _fake_seeded() -> Seeded:
    """Ids of the right number and shape, for preparing the statements before the seed: the SQL
    text (and so the prepared statement) depends only on how many ids each one names."""

    def fake(i: int) -> str:
        return f"job_{i:032x}"

    middles = [fake(100 + i) for i in range(DIAMOND_SIZE - 2)]
    return Seeded([fake(i) for i in range(DIAMONDS)], middles, fake(999), fake(998))


async def seed_small(url: str) -> None:
    """A database as a server meets it early on: a few dozen jobs, one small graph."""
    configure_logging("warning")
    await asyncio.to_thread(migrate.upgrade, url)
    repo = SqlJobRepository(create_engines(url), SystemClock())
    try:
        items = [NewJob(OWNER, "graph.root", {})]
        items += [NewJob(OWNER, "graph.step", {}, depends_on_items=(0,)) for _ in range(8)]
        items.append(NewJob(OWNER, "graph.step", {}, depends_on_items=tuple(range(1, 9))))
        await repo.enqueue_batch(items)
        await repo.enqueue_batch([NewJob(OWNER, "small.done", {}) for _ in range(20)])
        for one in (await repo.claim(WORKER, 20, 3600, KindFilter(only=frozenset({"small.done"})))).jobs:
            await repo.succeed_status(one.lease, {"n": 1})
    finally:
        await repo.close()


def report_stale(conn: Connection, all_cases: Sequence[Case]) -> Iterator[str]:
    yield (
        "=== PostgreSQL: the plans a connection cached while the tables were small (prepared and"
        f" run {_WARM_RUNS} times on a database of {_SMALL_JOBS} jobs, then the seed; no ANALYZE"
        " since, autovacuum held off for the demonstration: its ANALYZE would drop these plans) ==="
    )
    for index, case in enumerate(all_cases):
        if case.planned_afresh:
            postgres.DIALECT.plan_afresh(conn)
        _, rows = explained(conn, case.statement(True), case.params, _explain_prepared(f"stale_{index}"))
        conn.rollback()
        lines = [str(row[0]) for row in rows]
        verdict, flags = pg_verdict(case, lines)
        how = "planned afresh, as the server runs it" if case.planned_afresh else "cached plan"
        yield f"\n-- {case.name}: {case.what} ({how})  [{verdict}]"
        yield from (f"   | {line}" for line in lines)
        yield from (f"   ! {flag}" for flag in flags)


_SMALL_JOBS = 30


def run_postgres(url: str, total: int) -> Iterator[str]:
    asyncio.run(seed_small(url))
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            for table in _GRAPH_TABLES:
                conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        with engine.connect() as stale:
            # The statements are prepared by hand here: psycopg's own preparing would, at the
            # first rollback, deallocate every prepared statement of the session (its rule).
            stale.connection.driver_connection.prepare_threshold = None  # type: ignore[union-attr]
            for index, case in enumerate(cases(_fake_seeded())):
                explained(stale, case.statement(True), case.params, _prepare_and_warm(f"stale_{index}"))
                stale.rollback()
            began = time.monotonic()
            seeded = asyncio.run(seed(url, total))
            yield f"(PostgreSQL: seeded {total} jobs in {time.monotonic() - began:.0f} s)"
            all_cases = cases(seeded)
            yield from report_stale(stale, all_cases)
        with engine.begin() as conn:
            for table in _GRAPH_TABLES:
                conn.execute(text(f"ALTER TABLE {table} RESET (autovacuum_enabled)"))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
        yield ""
        yield from report_postgres(engine, all_cases)
    finally:
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.explain_graphs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the database (default 100,000)")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument(
        "--postgres-url", help="an empty PostgreSQL database to use (default: a throwaway cluster)"
    )
    parser.add_argument("--keep", help="keep the SQLite file in this directory")
    options = parser.parse_args(argv)
    floor = DIAMONDS * DIAMOND_SIZE + 2 * (OLD_PAIRS + KEPT_PAIRS) + BACKLOG
    if options.jobs < floor + 2:
        parser.error(f"--jobs: at least {floor + 2}")
    directory = Path(options.keep) if options.keep else Path(tempfile.mkdtemp(prefix="explain-graphs-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        for line in run_sqlite(directory, options.jobs):
            print(line, flush=True)
        if options.no_postgres:
            return 0
        print(flush=True)
        if options.postgres_url:
            for line in run_postgres(options.postgres_url, options.jobs):
                print(line, flush=True)
            return 0
        from tests.postgres_cluster import PostgresCluster, find_bin_dir

        bin_dir = find_bin_dir()
        if bin_dir is None:
            print(
                "PostgreSQL: no server binaries (initdb, pg_ctl); --no-postgres or --postgres-url",
                file=sys.stderr,
            )
            return 1
        cluster = PostgresCluster(bin_dir).init().start()
        try:
            name = cluster.create_database(prefix="explain")
            for line in run_postgres(cluster.url(name), options.jobs):
                print(line, flush=True)
        finally:
            cluster.destroy()
    finally:
        if not options.keep:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

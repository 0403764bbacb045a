"""The seam between the shared SQL engine and each database: everything that
differs between SQLite and PostgreSQL, as one value per database.

Shared code (the repository, the group-commit writer) asks the `SqlDialect`
it was built with and never which database it is on. Each database is one
module (`sqlite.py`, `postgres.py`) that builds its `SqlDialect`; adding a
database is one such module and one entry in `DIALECT_MODULES`. A
`SqlDialect` has no optional parts, so a module missing one fails when it is
imported, which is at start-up (the URL is checked before anything is served),
never mid-request.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import Insert, Update

from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.records import Lease

if TYPE_CHECKING:
    from leasehold._server.jobs.sql.statements import ManyLeaseStatements
    from leasehold._server.jobs.sql.writer import GroupCommitWriter

# Tells other processes, inside a batch's transaction, that it made new work
# claimable (the flag) and appended events of these jobs (the ids): returns
# statements (complete, without parameters, each ending in ';') that the writer
# sends together with its COMMIT, in the same round trip.
# (work changed, job ids with new events, feed keys of owners with new events) -> SQL.
Announce = Callable[[bool, list[str], list[str]], str]


class Pacing(Protocol):
    """When the writer may begin its next batch. `before_batch` runs as work
    arrives (it may wait); `after_batch` hears how long a batch held the database."""

    async def before_batch(self, idle_seconds: float) -> None: ...

    def after_batch(self, held_seconds: float) -> None: ...


class ChangeFeed(Protocol):
    """Brings other processes' commits to this process's ChangeHub."""

    async def run(self) -> None:
        """Until cancelled."""
        ...


@dataclass(frozen=True)
class Engines:
    """The connections to one database: the writer's engine (one connection, held
    by the writer's thread), the pooled async engine for reads, and the dialect
    that knows how to talk to both."""

    dialect: SqlDialect
    writer: Engine
    reader: AsyncEngine

    async def dispose(self) -> None:
        self.writer.dispose()
        await self.reader.dispose()


@dataclass(frozen=True)
class SqlDialect:
    name: str
    # Opens every write transaction (SQLite takes the write lock up front;
    # PostgreSQL names its isolation level whatever the database's default).
    begin_statement: str
    # URL -> the URL this service will use, or ValueError naming database_url.
    check_url: Callable[[URL], URL]
    create_engines: Callable[[URL, int], Engines]
    # The statement leasing the jobs a claim chose (`steering.choose`), under
    # `token` (the claim transition), and the parameters naming those jobs.
    claim_chosen: Update
    chosen_parameters: Callable[[list[str]], dict[str, Any]]
    # Whether the claim's reads lock the rows they choose (FOR UPDATE SKIP LOCKED),
    # so that claims made at once by several processes never choose the same job.
    locks_rows: bool
    # Run first by every claim while limits are set, so that no two claims (in any
    # process) count running jobs and draw tokens at once.
    lock_claims: Callable[[Connection], None]
    # Run before a statement that names its rows by key through a join or a
    # list (a graph's parents and children): plans it afresh for this
    # transaction. A generic plan the database cached for a prepared statement
    # while the tables were small would walk them whole once they are not.
    plan_afresh: Callable[[Connection], None]
    # A rate bucket's row, written whether or not it exists yet.
    upsert_bucket: Insert
    # Every expired lease, recovered (the recover transition).
    recover_expired: Update
    # Every running attempt past its deadline, ended (the end-overdue transition).
    end_overdue: Update
    # What runs for many leases in one statement, and the parameters naming those leases.
    many_leases: ManyLeaseStatements
    lease_parameters: Callable[[Sequence[Lease], datetime], dict[str, Any]]
    # A job insert that yields no row when the resource's root job already exists.
    insert_if_new: Insert
    # A request id's row that yields nothing when the owner's key is taken.
    insert_request_id: Insert
    # A kind's paused row, written nothing when the kind is paused already.
    insert_paused_kind: Insert
    # Owners' feed heads moved on (`sql.feed.advance_heads`).
    advance_feed_heads: Insert
    # Many rows into one table in one statement: (conn, table name, rows).
    bulk_insert: Callable[[Connection, str, list[dict[str, Any]]], None]
    # The writer's pacing, a fresh one per writer.
    pacing: Callable[[], Pacing]
    # Whether an error says the batch lost a lock conflict with another writer
    # (then it is run again, up to `conflict_attempts` times in all).
    is_write_conflict: Callable[[BaseException], bool]
    conflict_attempts: int
    # What the writer sends with a COMMIT so that other processes hear of it (or None).
    announce: Callable[[str], Announce | None]
    # How this process hears of other processes' commits: (engines, changes, writer,
    # origin, poll seconds) -> the feed to run.
    change_feed: Callable[[Engines, ChangeHub, GroupCommitWriter, str, float], ChangeFeed]


# Each database's module, imported when a URL names it (PostgreSQL's needs the
# optional psycopg driver, which a SQLite user need not install).
DIALECT_MODULES = {
    "sqlite": "leasehold._server.jobs.sql.sqlite",
    "postgresql": "leasehold._server.jobs.sql.postgres",
}


def dialect_named(name: str) -> SqlDialect:
    module = importlib.import_module(DIALECT_MODULES[name])
    dialect = module.DIALECT
    assert isinstance(dialect, SqlDialect), f"{module.__name__}.DIALECT is not a SqlDialect"
    return dialect

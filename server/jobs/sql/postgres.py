"""PostgreSQL: many replicas writing at once, row locks, NOTIFY and LISTEN.

Driver: psycopg 3 for both engines. It has a synchronous and an asyncio API over
one implementation, so the writer thread keeps its cheap synchronous calls and
reads and LISTEN stay on the event loop (asyncpg has no synchronous API).
`postgresql://` means psycopg. psycopg is an optional extra: it is imported
only where a connection is made.

Every statement here is written for READ COMMITTED: claims and lease recovery
lock their rows with SKIP LOCKED, and every other write is fenced by a row lock
on the job it changes. The writer names the level in each BEGIN, whatever the
database's default.

Changes across replicas: each writer batch that made work claimable or
appended events sends, inside its own transaction, one notification naming its
origin (the process), whether it made work, and the ids of the jobs whose logs
grew. PostgreSQL delivers it to every listening session when, and only when,
that transaction commits. The listener of every other replica then wakes its
idle workers and tells the subscribers of those jobs to read the log: the
events themselves stay in the database, which is what a notification's
8,000-byte limit and a subscriber's gap-free guarantee both want. A session
that is not listening misses notifications for good, so whenever the listener
(re)connects it first LISTENs and then announces unknown changes: every idle
worker looks for work and every subscriber reads its log once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import JSON, String, Table, and_, any_, bindparam, func, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection, create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.records import Lease
from leasehold._server.jobs.sql import admin as sql_admin
from leasehold._server.jobs.sql import feed as feed_rows
from leasehold._server.jobs.sql import request_ids
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql.dialect import Announce, Engines, SqlDialect
from leasehold._server.jobs.sql.engines import POSTGRES_URL_HINT, WRITER_ENGINE_NAME
from leasehold._server.jobs.sql.errors import is_write_conflict
from leasehold._server.jobs.sql.tables import UtcTimestamp, job_events, jobs, rate_buckets
from leasehold._server.jobs.sql.transitions import NOW, RETURNING, update_for

if TYPE_CHECKING:
    from leasehold._server.jobs.sql.writer import GroupCommitWriter

log = structlog.get_logger("leasehold.storage")

# libpq settings of every connection, unless the URL gives its own. A server
# that is down or unreachable fails a new connection within 5 s. A connection
# whose peer went silent (a partition, a firewall dropping its packets) is found
# dead by the unacknowledged-data timeout when a request is on the wire (the
# writer, which has one at least every heartbeat or claim poll), and by TCP
# keepalives when it is idle (the listener), instead of waiting forever. Only the
# peer's kernel acknowledges data, so a slow statement never trips the first:
# 10 s of silence means the path is gone, and the replica turns NOT_SERVING
# well before a caller's usual deadline.
POSTGRES_CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
# The writer's sessions: a statement that waits 5 s for a row lock gives up (its
# caller hears UNAVAILABLE) so that one job locked by a stalled replica cannot
# hold up every write of this one. A session of ours left inside a transaction
# for 10 s (this process frozen mid-batch, or cut off from the server between
# two statements of one) is ended by the server, so its row locks do not keep
# the other replicas from the jobs whose leases lapse meanwhile. The writer runs
# a batch's statements back to back, so only such a fault leaves one idle that long.
WRITER_SESSION_OPTIONS = "-c lock_timeout=5s -c idle_in_transaction_session_timeout=10s"

# How many times a batch runs when it keeps losing lock conflicts (deadlocks)
# to other writers, before its callers are told to retry.
CONFLICT_ATTEMPTS = 5

# ----- connections ----------------------------------------------------------------------


# Leasehold writes, so only a primary will do; with several hosts, libpq tries
# them in turn until one is (a primary and its standbys, after a failover).
_WRITABLE_SESSIONS = ("read-write", "primary")


def _host_count(url: URL) -> int:
    """Hosts named by the URL: in its host part (`a,b`) or as `?host=` values."""
    named = url.query.get("host", url.host or "")
    values = (named,) if isinstance(named, str) else tuple(named)
    return sum(len([host for host in value.split(",") if host]) for value in values)


def check_url(url: URL) -> URL:
    if "+" in url.drivername and url.get_driver_name() != "psycopg":
        raise ValueError(
            f"database_url: unsupported database driver {url.drivername!r}; use {POSTGRES_URL_HINT}"
        )
    if not url.database:
        raise ValueError(f"database_url: name the PostgreSQL database, as in {POSTGRES_URL_HINT}")
    if importlib.util.find_spec("psycopg") is None:
        raise ValueError(
            "database_url: PostgreSQL needs the psycopg driver; "
            "install it with pip install 'leasehold[postgres]'"
        )
    attrs = url.query.get("target_session_attrs")
    if attrs is not None and attrs not in _WRITABLE_SESSIONS:
        raise ValueError(
            f"database_url: target_session_attrs={attrs!r} may reach a standby, which refuses writes; "
            "use read-write (or primary), the default when the URL names several hosts"
        )
    defaults = dict(POSTGRES_CONNECTION_DEFAULTS)
    if _host_count(url) > 1:
        defaults["target_session_attrs"] = "read-write"
    url = url.set(drivername="postgresql+psycopg")
    return url.update_query_dict({k: v for k, v in defaults.items() if k not in url.query})


def create_engines(url: URL, pool_size: int) -> Engines:
    """No pre-ping on checkout (a round trip per read): when a read finds its
    connection dead, SQLAlchemy discards every pooled connection older than
    that, and the read is tried once more on a fresh one."""
    common: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "hide_parameters": True}
    options = " ".join(filter(None, [WRITER_SESSION_OPTIONS, str(url.query.get("options", ""))]))
    writer = create_engine(
        url.update_query_dict({"options": options}),
        poolclass=NullPool,
        logging_name=WRITER_ENGINE_NAME,
        **common,
    )
    reader = create_async_engine(
        url, pool_size=pool_size, max_overflow=0, pool_reset_on_return=None, **common
    )
    return Engines(dialect=DIALECT, writer=writer, reader=reader)


def listener_connect_args(engines: Engines) -> dict[str, Any]:
    """Keyword arguments for `psycopg.AsyncConnection.connect` that reach the
    same database as `engines` with the same settings, for a connection outside
    the pool."""
    reader = engines.reader
    _args, kwargs = reader.dialect.create_connect_args(reader.url)
    kwargs.pop("context", None)  # SQLAlchemy's type adapters; a LISTEN needs none
    return {**kwargs, "autocommit": True}


# ----- statements ---------------------------------------------------------------------------

# Many replicas claim and recover at once, each in its own transaction. Each
# statement first locks the rows it will change with FOR UPDATE SKIP LOCKED, in
# a FROM subquery, which PostgreSQL runs exactly once: a row another replica is
# changing is skipped, not waited for (so replicas never queue behind, or
# deadlock with, each other here), and a row that another replica changed since
# this statement began is checked against the conditions again before it is
# locked (READ COMMITTED re-checks a row whose newer version it locks). Then the
# UPDATE changes just the locked rows. No job can be claimed twice, and every
# replica may recover expired leases at the same moment: each expired lease is
# recovered once.
_candidate = jobs.alias("candidate")
_expired = (
    select(_candidate.c.id)
    .where(_candidate.c.status == sql.RUNNING, _candidate.c.lease_expires_at <= NOW)
    .with_for_update(skip_locked=True)
    .subquery("expired")
)
_overdue = (
    select(_candidate.c.id)
    .where(_candidate.c.status == sql.RUNNING, _candidate.c.deadline_at <= NOW)
    .with_for_update(skip_locked=True)
    .subquery("overdue")
)


# The claim's reads locked the rows it chose (FOR UPDATE SKIP LOCKED), so this
# changes them with no further wait; the ids travel as one array parameter.
_CLAIM_CHOSEN = update_for(
    sm.CLAIM,
    jobs.c.id == any_(bindparam("claim_ids", type_=postgresql.ARRAY(String()))),
    returning=(*RETURNING, *sql.CLAIMED_EXTRA),
)


def _chosen_parameters(job_ids: list[str]) -> dict[str, Any]:
    return {"claim_ids": job_ids}


# One lock for every claim of every replica while limits are set: the key is
# any fixed number no other user of the database is likely to take.
CLAIM_LOCK_KEY = 0x1EA5E401D
_CLAIM_LOCK = f"SELECT pg_advisory_xact_lock({CLAIM_LOCK_KEY})"


def _plan_afresh(conn: Connection) -> None:
    """psycopg prepares a statement run five times on a connection, and the
    server may then keep one generic plan for it, chosen from the table's
    size at that time (a fresh database's handful of jobs: a sequential scan).
    Custom plans see the table as it is now; SET LOCAL ends with the
    transaction."""
    conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")


def _lock_claims(conn: Connection) -> None:
    """Held until the claim's transaction ends: the next claim, on any replica,
    counts running jobs and tokens after this one committed."""
    conn.exec_driver_sql(_CLAIM_LOCK)


_upsert = postgresql.insert(rate_buckets).values(
    kind=bindparam("kind"), tokens=bindparam("tokens"), refilled_at=bindparam("refilled_at")
)
_UPSERT_BUCKET = _upsert.on_conflict_do_update(
    index_elements=[rate_buckets.c.kind],
    set_={"tokens": _upsert.excluded.tokens, "refilled_at": _upsert.excluded.refilled_at},
)


_RECOVER_EXPIRED = update_for(sm.RECOVER_EXPIRED_LEASE, jobs.c.id == _expired.c.id)
_END_OVERDUE = update_for(sm.END_OVERDUE, jobs.c.id == _overdue.c.id)

# Many leases at once arrive as two arrays (`job_ids`, `tokens`) unnested into
# rows: one parameter each however many leases (psycopg adapts every parameter
# in Python), and one statement text for every batch size, which the server then
# prepares once instead of planning each distinct list length.
_lease_rows = (
    func.unnest(
        bindparam("job_ids", type_=postgresql.ARRAY(String())),
        bindparam("tokens", type_=postgresql.ARRAY(String())),
    )
    .table_valued("job_id", "token")
    .render_derived(name="lease")
)
_FENCED_MANY = and_(
    jobs.c.id == _lease_rows.c.job_id,
    jobs.c.lease_token == _lease_rows.c.token,
    jobs.c.status == sql.RUNNING,
    jobs.c.lease_expires_at > NOW,
)
_MANY_LEASES = sql.many_leases(_FENCED_MANY)


def _lease_parameters(leases: Sequence[Lease], now: datetime) -> dict[str, Any]:
    return {
        "job_ids": [lease.job_id for lease in leases],
        "tokens": [lease.token for lease in leases],
        "now": now,
    }


_INSERT_IF_NEW = sql.insert_if_new(postgresql.insert)
_INSERT_REQUEST_ID = request_ids.insert_if_new(postgresql.insert)
_INSERT_PAUSED_KIND = sql_admin.insert_paused_kind(postgresql.insert)


class _RecordsetInsert:
    """Many rows into one table in one statement. psycopg's executemany adapts
    every parameter of every row in Python; instead the rows travel as one JSON
    array, which the server unpacks with `json_to_recordset` into the table's
    own column types: one parameter however many rows.

    A JSON column's value travels as its serialized text and is cast back to
    JSON by the server: unpacked as a nested JSON value instead, a string
    holding U+0000 (which JSON may carry, and a payload may hold) would be
    refused as text PostgreSQL cannot store."""

    def __init__(self, table: Table, columns: Sequence[str]) -> None:
        self._columns = tuple(columns)
        dialect = postgresql.dialect()
        self._encoders: dict[str, Callable[[Any], Any]] = {}
        definitions, selected = [], []
        for name in self._columns:
            column_type = table.c[name].type
            if isinstance(column_type, UtcTimestamp):
                self._encoders[name] = _timestamp_encoder(column_type)
            if isinstance(column_type, JSON):
                self._encoders[name] = _json_text
                definitions.append(f"{name} text")
                selected.append(f"{name}::json")
            else:
                definitions.append(f"{name} {column_type.compile(dialect=dialect)}")
                selected.append(name)
        self._statement = (
            f"INSERT INTO {table.name} ({', '.join(self._columns)}) SELECT {', '.join(selected)} "
            f"FROM json_to_recordset(%s::json) AS incoming({', '.join(definitions)})"
        )

    def __call__(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        encoders = self._encoders
        encoded = [
            {name: (encoders[name](row[name]) if name in encoders else row[name]) for name in self._columns}
            for row in rows
        ]
        conn.exec_driver_sql(self._statement, (json.dumps(encoded, separators=(",", ":")),))


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _timestamp_encoder(column_type: UtcTimestamp) -> Callable[[Any], Any]:
    def encode(value: Any) -> Any:
        return column_type.process_bind_param(value, None)  # type: ignore[arg-type]

    return encode


_INSERTS = {
    "jobs": _RecordsetInsert(jobs, sql.NEW_JOB_COLUMNS),
    "job_events": _RecordsetInsert(job_events, sql.EVENT_COLUMNS),
}


def _bulk_insert(conn: Connection, table: str, rows: list[dict[str, Any]]) -> None:
    if rows:
        _INSERTS[table](conn, rows)


class _NoPacing:
    """Row locks, not one database lock: nothing to leave free for others."""

    async def before_batch(self, idle_seconds: float) -> None:
        return None

    def after_batch(self, held_seconds: float) -> None:
        return None


# ----- changes across replicas -----------------------------------------------------------------

CHANNEL = "leasehold_changes"
# PostgreSQL refuses a payload of 8,000 bytes or more; job ids are ASCII.
MAX_PAYLOAD_BYTES = 7_900
_FIELD = ";"
_ID = ","
_FEED = "@"

RECONNECT_FIRST_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 2.0


def payloads(origin: str, work: bool, job_ids: Sequence[str], feed_keys: Sequence[str] = ()) -> Iterator[str]:
    """The notifications for one batch: as few as fit the size limit; the first
    carries the work flag. The owners whose feeds the batch added to travel
    among the job ids as their keys (`notifications.feed_key`) marked with
    `_FEED` (a job id never begins so)."""
    head = f"{origin}{_FIELD}{int(work)}{_FIELD}"
    chunk: list[str] = []
    size = len(head)
    for job_id in [*job_ids, *(_FEED + key for key in feed_keys)]:
        if chunk and size + len(job_id) + 1 > MAX_PAYLOAD_BYTES:
            yield head + _ID.join(chunk)
            head = f"{origin}{_FIELD}0{_FIELD}"
            chunk, size = [], len(head)
        chunk.append(job_id)
        size += len(job_id) + 1
    if chunk or work:
        yield head + _ID.join(chunk)


def parse(payload: str) -> tuple[str, bool, list[str], list[str]] | None:
    """(origin, work, job ids, feed keys), or None for a payload that is not ours."""
    parts = payload.split(_FIELD)
    if len(parts) != 3 or parts[1] not in ("0", "1"):
        return None
    origin, work, ids = parts
    items = [item for item in ids.split(_ID) if item]
    return (
        origin,
        work == "1",
        [item for item in items if not item.startswith(_FEED)],
        [item[1:] for item in items if item.startswith(_FEED)],
    )


def notifier(origin: str) -> Announce:
    """The writer's `announce` hook: the NOTIFYs of a batch, sent with its COMMIT
    (one round trip fewer per batch; the values are quoted as literals)."""
    from psycopg import sql as pg_sql

    def announce(work: bool, job_ids: list[str], feed_keys: list[str]) -> str:
        return "".join(
            pg_sql.SQL("NOTIFY {}, {};")
            .format(pg_sql.Identifier(CHANNEL), pg_sql.Literal(payload))
            .as_string(None)
            for payload in payloads(origin, work, job_ids, feed_keys)
        )

    return announce


class ChangeListener:
    """LISTENs on its own connection (outside the pool, which it would otherwise
    hold forever) and republishes other replicas' changes on `changes`."""

    def __init__(self, connect_args: dict[str, Any], changes: ChangeHub, origin: str) -> None:
        self._connect_args = connect_args
        self._changes = changes
        self._origin = origin
        self.listening = asyncio.Event()

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after any failure (to whichever
        host of a multi-host URL is primary by then), with capped backoff. One
        warning when listening stops and one line when it is back, however
        many tries it took between; on its return every watcher and idle
        worker looks again, so nothing announced meanwhile is missed."""
        import psycopg

        delay = RECONNECT_FIRST_SECONDS
        lost_at: float | None = None
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(**self._connect_args) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    delay = RECONNECT_FIRST_SECONDS
                    if lost_at is not None:
                        log.info("storage.listen_restored", down_seconds=round(time.monotonic() - lost_at, 3))
                        lost_at = None
                    self._changes.publish_unknown_changes()
                    async for notification in conn.notifies():
                        self._deliver(notification.payload)
            except psycopg.Error as exc:
                if lost_at is None:
                    log.warning("storage.listen_failed", error=str(exc).strip(), retry_in_seconds=delay)
                else:
                    log.debug("storage.listen_retry_failed", error=str(exc).strip(), retry_in_seconds=delay)
            except Exception as exc:  # a bug: keep listening, loudly
                log.error("storage.listen_failed", error_class=type(exc).__name__, exc_info=exc)
            if lost_at is None:
                lost_at = time.monotonic()
            self.listening.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_SECONDS)

    def _deliver(self, payload: str) -> None:
        parsed = parse(payload)
        if parsed is None:
            log.warning("storage.notification_ignored", reason="not a leasehold payload")
            return
        origin, work, job_ids, feed_keys = parsed
        if origin == self._origin:
            return  # this process announced its own commits already
        if work:
            self._changes.publish_work()
        if job_ids:
            self._changes.publish_job_changes(job_ids)
        if feed_keys:
            self._changes.publish_feed_changes(feed_keys)


def _change_feed(
    engines: Engines, changes: ChangeHub, writer: GroupCommitWriter, origin: str, poll_seconds: float
) -> ChangeListener:
    return ChangeListener(listener_connect_args(engines), changes, origin)


DIALECT = SqlDialect(
    name="postgresql",
    begin_statement="BEGIN ISOLATION LEVEL READ COMMITTED",
    check_url=check_url,
    create_engines=create_engines,
    claim_chosen=_CLAIM_CHOSEN,
    chosen_parameters=_chosen_parameters,
    locks_rows=True,
    lock_claims=_lock_claims,
    plan_afresh=_plan_afresh,
    upsert_bucket=_UPSERT_BUCKET,
    recover_expired=_RECOVER_EXPIRED,
    end_overdue=_END_OVERDUE,
    many_leases=_MANY_LEASES,
    lease_parameters=_lease_parameters,
    insert_if_new=_INSERT_IF_NEW,
    insert_request_id=_INSERT_REQUEST_ID,
    insert_paused_kind=_INSERT_PAUSED_KIND,
    advance_feed_heads=feed_rows.advance_heads(postgresql.insert),
    bulk_insert=_bulk_insert,
    pacing=_NoPacing,
    is_write_conflict=is_write_conflict,
    conflict_attempts=CONFLICT_ATTEMPTS,
    announce=notifier,
    change_feed=_change_feed,
)

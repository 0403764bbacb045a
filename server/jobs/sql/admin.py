"""AdminService's storage on the SQL engines: queue stats, listing across owners,
bulk cancel and retry in keyset batches, paused kinds, and the leases remote
workers hold.

Every read is an index range bounded by the live queue or the last hour:
queued and running jobs by `ix_jobs_status_available_at`, finished ones by
`ix_jobs_status_completed_at`, a status's jobs newest first by
`ix_jobs_status_seq` (migration 0010), live leases by
`ix_jobs_status_lease_expires_at`. A bulk batch locks its jobs (PostgreSQL)
and changes them with the state machine's own UPDATEs for Cancel (one per
transition for the whole batch), or inserts their retries as Retry would, in
one short transaction of its own (on PostgreSQL through retention's writer,
not the claims').
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    and_,
    bindparam,
    delete,
    exists,
    false,
    func,
    or_,
    select,
    true,
)
from sqlalchemy import type_coerce as coerce
from sqlalchemy.sql.dml import Insert

from leasehold._server.jobs import admin
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.records import JobPage, JobStatus, PageCursor
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql.tables import UtcTimestamp, jobs, paused_kinds
from leasehold._server.jobs.sql.transitions import JOB_COLUMNS, update_for

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MINUTE_MICROSECONDS = 60_000_000
FINISHED = sorted(status.value for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED))

LIVE_BY_KIND = (
    select(jobs.c.kind, jobs.c.status, func.count().label("jobs"))
    .where(jobs.c.status.in_([sql.QUEUED, sql.RUNNING]))
    .group_by(jobs.c.kind, jobs.c.status)
)
RUNNING_BY_OWNER = (
    select(jobs.c.owner_id, func.count().label("jobs"))
    .where(jobs.c.status == sql.RUNNING)
    .group_by(jobs.c.owner_id)
)
OLDEST_DUE = (
    select(jobs.c.id, jobs.c.available_at).where(sql.DUE).order_by(jobs.c.available_at, jobs.c.seq).limit(1)
)
# Microseconds divided into whole minutes since the epoch (`//` is integer
# division on both engines); the timestamp type is set aside so no datetime
# conversion applies.
_MINUTE = (coerce(jobs.c.completed_at, BigInteger()) // _MINUTE_MICROSECONDS).label("minute")
FINISHED_SINCE = (
    select(jobs.c.kind, jobs.c.status, _MINUTE, func.count().label("jobs"))
    .where(jobs.c.status.in_(FINISHED), jobs.c.completed_at >= bindparam("since", type_=UtcTimestamp()))
    .group_by(jobs.c.kind, jobs.c.status, _MINUTE)
)
PAUSED = select(paused_kinds.c.kind).order_by(paused_kinds.c.kind)
NEWEST = select(func.max(jobs.c.seq))  # the primary key's last entry
IS_PAUSED = select(paused_kinds.c.kind).where(paused_kinds.c.kind == bindparam("kind"))
RESUME = delete(paused_kinds).where(paused_kinds.c.kind == bindparam("kind"))

# ListWorkers: the live leases of running jobs, a range of
# ix_jobs_status_lease_expires_at, per (worker, kind).
_LIVE_LEASES = and_(
    jobs.c.status == sql.RUNNING, jobs.c.lease_expires_at > bindparam("now", type_=UtcTimestamp())
)
_WORKERS: Any = bindparam("workers", expanding=True)


def remote_leases(remote_kinds: KindPatterns) -> Any:
    """The live leases of remote workers: of a kind `remote_kinds` matches,
    or held by one of the `workers` parameter, grouped per (worker, kind)."""
    remote = [jobs.c.kind.startswith(prefix, autoescape=True) for prefix in remote_kinds.prefixes]
    if remote_kinds.exact:
        remote.append(jobs.c.kind.in_(sorted(remote_kinds.exact)))
    return (
        select(
            jobs.c.lease_owner,
            jobs.c.kind,
            func.count().label("jobs"),
            func.max(jobs.c.lease_expires_at).label("latest"),
        )
        .where(_LIVE_LEASES, or_(false(), jobs.c.lease_owner.in_(_WORKERS), *remote))
        .group_by(jobs.c.lease_owner, jobs.c.kind)
    )


_SEQS: Any = bindparam("seqs", expanding=True)
_BELOW = bindparam("below", type_=BigInteger())
_LIMIT = bindparam("limit", type_=Integer())
# Cancel's two transitions (`state_machine.owner_cancel`), each over a batch's
# rows by `seq`: the primary key, in insertion order, so a batch is a few
# hundred neighbouring rows that every planner reads by that index (by `id`,
# in random order, PostgreSQL prefers walking a small table whole). The batch
# read its rows in the same transaction, locked (PostgreSQL) or under the
# database's one write lock (SQLite), and chose each one's transition from its
# status, as the claim does: no status re-check here, which would also tempt a
# planner without fresh statistics into a status index.
CANCELS = {transition.name: transition for transition in (sm.CANCEL_QUEUED, sm.REQUEST_CANCEL)}
BULK_CANCEL = {name: update_for(transition, jobs.c.seq.in_(_SEQS)) for name, transition in CANCELS.items()}
_retry_of = jobs.alias("retry_of")
HAS_RETRY = exists().where(_retry_of.c.retry_of_job_id == jobs.c.id)
RETRIED_AMONG = select(jobs.c.retry_of_job_id).where(
    jobs.c.retry_of_job_id.in_(bindparam("ids", expanding=True))
)


def batch(job_filter: admin.AdminFilter, unretried: bool, lock: bool, whole_rows: bool) -> Any:
    """A bulk batch's jobs: matching, below `below`, newest first, `limit` of
    them (`unretried`: of jobs with no retry yet); a cancel and a dry run read
    only what chooses a transition, a retry (`whole_rows`) the row it copies.
    Locked (`lock`) as Cancel and Retry lock their job: a claim skips these
    rows (SKIP LOCKED) rather than waiting, and retention cannot delete a
    source between its read and its retry's insert."""
    columns = (jobs,) if whole_rows else (jobs.c.seq, jobs.c.id, jobs.c.status, jobs.c.cancel_requested_at)
    statement = select(*columns).where(matching(job_filter), jobs.c.seq < _BELOW)
    if unretried:
        statement = statement.where(~HAS_RETRY)
    statement = statement.order_by(jobs.c.seq.desc()).limit(_LIMIT)
    return statement.with_for_update() if lock else statement


def batch_parameters(below: int | None, limit: int) -> dict[str, Any]:
    # A first batch's keyset bound: above every job.
    return {"below": 2**62 if below is None else below, "limit": limit}


def matching(job_filter: admin.AdminFilter) -> ColumnElement[bool]:
    """`job_filter` as a condition on the jobs table, its values bound as parameters."""
    conditions: list[ColumnElement[bool]] = [true()]
    statuses = job_filter.jobs.statuses
    if statuses:
        conditions.append(jobs.c.status.in_(sorted(status.value for status in statuses)))
    for column, value in (
        (jobs.c.owner_id, job_filter.owner_id),
        (jobs.c.kind, job_filter.jobs.kind),
        (jobs.c.resource_type, job_filter.jobs.resource_type),
        (jobs.c.resource_id, job_filter.jobs.resource_id),
    ):
        if value:
            conditions.append(column == value)
    return and_(*conditions)


def minute_start(minute: int) -> datetime:
    return _EPOCH + timedelta(minutes=int(minute))


def insert_paused_kind(dialect_insert: Callable[[Any], Any]) -> Insert:
    """A kind's paused row (with the database's own `insert`, which knows ON
    CONFLICT); nothing is written when the kind is paused already."""
    return dialect_insert(paused_kinds).on_conflict_do_nothing(index_elements=[paused_kinds.c.kind])


class SqlAdmin:
    """AdminService's reads across every owner, on the repository's readers."""

    def __init__(self, read: Callable[..., Awaitable[Sequence[Any]]]) -> None:
        self._read = read

    async def queue_stats(self, now: datetime) -> admin.QueueStats:
        live = await self._read(LIVE_BY_KIND)
        owners = await self._read(RUNNING_BY_OWNER)
        due = await self._read(sql.QUEUED_BY_KIND, {"now": now})
        oldest = await self._read(OLDEST_DUE, {"now": now})
        finished = await self._read(FINISHED_SINCE, {"since": admin.stats_since(now)})
        paused = await self._read(PAUSED)
        return admin.assemble_stats(
            now,
            live=[(row.kind, JobStatus(row.status), row.jobs) for row in live],
            running_by_owner=[(row.owner_id, row.jobs) for row in owners],
            oldest_due_by_kind={row.kind: row.oldest for row in due},
            finished=[
                (row.kind, JobStatus(row.status), minute_start(row.minute), row.jobs) for row in finished
            ],
            oldest=(oldest[0].id, oldest[0].available_at) if oldest else None,
            paused={row.kind for row in paused},
        )

    async def lease_holders(
        self, now: datetime, remote_kinds: KindPatterns, worker_ids: Collection[str]
    ) -> list[admin.LeaseHolder]:
        if not remote_kinds and not worker_ids:
            return []  # no remote worker can hold a lease
        rows = await self._read(remote_leases(remote_kinds), {"now": now, "workers": sorted(worker_ids)})
        return admin.lease_holders((row.lease_owner, row.kind, row.jobs, row.latest) for row in rows)

    async def list_all_jobs(
        self, job_filter: admin.AdminFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        statement = select(*JOB_COLUMNS).where(matching(job_filter))
        if after is not None:
            after_seq = select(jobs.c.seq).where(jobs.c.id == after.job_id).scalar_subquery()
            statement = statement.where(jobs.c.seq < after_seq)
        rows = await self._read(statement.order_by(jobs.c.seq.desc()).limit(page_size + 1))
        page, more = rows[:page_size], len(rows) > page_size
        return JobPage(
            jobs=[sm.job_of(row._mapping) for row in page],
            next_cursor=PageCursor(page[-1].id) if more else None,
        )

    async def newest_position(self) -> int:
        rows = await self._read(NEWEST)
        return (rows[0][0] or 0) + 1

    async def is_paused(self, kind: str) -> bool:
        return bool(await self._read(IS_PAUSED, {"kind": kind}))

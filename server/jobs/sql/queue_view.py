"""The claim's questions (`steering.QueueView`) as SQL, asked inside the claim's
write transaction, and the statements that act on the answer.

Every question is an index seek on `ix_jobs_claim_order` (status, priority,
owner_id, available_at, seq): the owners with due jobs at a priority are found
by a loose index scan (a recursive query that jumps from one owner to the
next, never reading an owner's other jobs), and an owner's oldest due jobs are
a range of that index. The claim then updates exactly the rows chosen.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String, bindparam, func, literal, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.sql.selectable import Select

from leasehold._server.jobs import steering
from leasehold._server.jobs.records import PRIORITIES
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql.dialect import SqlDialect
from leasehold._server.jobs.sql.tables import UtcTimestamp, jobs, rate_buckets
from leasehold._server.jobs.sql.transitions import NOW

_PRIORITY = bindparam("priority", type_=Integer())
_COUNT = bindparam("count", type_=Integer())
_OWNER = bindparam("owner", type_=String())
_AFTER_AT = bindparam("after_at", type_=UtcTimestamp())
_AFTER_SEQ = bindparam("after_seq", type_=Integer())

RUNNING_COUNTS = (
    select(jobs.c.owner_id, jobs.c.kind, func.count().label("running"))
    .where(jobs.c.status == sql.RUNNING, jobs.c.lease_expires_at > NOW)
    .group_by(jobs.c.owner_id, jobs.c.kind)
)


@functools.cache
def due_priorities(kinds: KindFilter) -> Select[Any]:
    """For each priority, its first and its last owner (in id order) with a due
    job `kinds` admits, or NULLs: one row, two seeks of the claim order's index
    per priority (asked in that index's order, so no planner prefers a scan
    that a table of finished jobs would make slow)."""
    candidate = jobs.alias("candidate")

    def edge(priority: int, order: Any, label: str) -> Any:
        return (
            select(candidate.c.owner_id)
            .where(
                candidate.c.status == sql.QUEUED,
                candidate.c.priority == priority,
                candidate.c.available_at <= NOW,
                sql.kind_condition(kinds, candidate),
            )
            .order_by(order)
            .limit(1)
            .scalar_subquery()
            .label(label)
        )

    return select(
        *(
            column
            for priority in PRIORITIES
            for column in (
                edge(priority, candidate.c.owner_id, f"first{priority}"),
                edge(priority, candidate.c.owner_id.desc(), f"last{priority}"),
            )
        )
    )


@functools.cache
def owners_with_due(kinds: KindFilter) -> Select[Any]:
    """Up to `count` owners after `after` (in id order) with a due job at
    `priority` that `kinds` admits. Each step seeks the first such job of the
    next owner, so the scan costs one seek per owner found."""
    candidate = jobs.alias("candidate")

    def first_owner_after(after: Any) -> Any:
        return (
            select(candidate.c.owner_id)
            .where(
                candidate.c.status == sql.QUEUED,
                candidate.c.priority == _PRIORITY,
                candidate.c.owner_id > after,
                candidate.c.available_at <= NOW,
                sql.kind_condition(kinds, candidate),
            )
            .order_by(candidate.c.owner_id)
            .limit(1)
            .scalar_subquery()
        )

    start = select(
        first_owner_after(bindparam("after", type_=String())).label("owner_id"),
        literal(1, Integer()).label("found"),
    ).cte("owners", recursive=True)
    step = select(first_owner_after(start.c.owner_id), start.c.found + 1).where(
        start.c.owner_id.is_not(None), start.c.found < _COUNT
    )
    owners = start.union_all(step)
    return select(owners.c.owner_id).where(owners.c.owner_id.is_not(None))


@functools.cache
def heads(kinds: KindFilter, blocking: bool, after: bool, locks: bool) -> Select[Any]:
    """Up to `count` of one owner's due jobs at `priority`, in claim order;
    `blocking`: none of the kinds in `blocked`; `after`: placed after
    (`after_at`, `after_seq`); `locks`: rows other claims hold are skipped and
    the rest locked (PostgreSQL)."""
    statement = select(jobs.c.id, jobs.c.kind, *sql.claim_order()).where(
        jobs.c.status == sql.QUEUED,
        jobs.c.priority == _PRIORITY,
        jobs.c.owner_id == _OWNER,
        jobs.c.available_at <= NOW,
        sql.kind_condition(kinds),
    )
    if blocking:
        statement = statement.where(jobs.c.kind.not_in(bindparam("blocked", expanding=True)))
    if after:
        statement = statement.where(tuple_(*sql.claim_order()) > tuple_(_AFTER_AT, _AFTER_SEQ))
    statement = statement.order_by(*sql.claim_order()).limit(_COUNT)
    if locks:
        statement = statement.with_for_update(skip_locked=True)
    return statement


KIND_RUNNING = select(func.count()).where(
    jobs.c.status == sql.RUNNING, jobs.c.lease_expires_at > NOW, jobs.c.kind == bindparam("kind")
)
OWNER_RUNNING = select(func.count()).where(
    jobs.c.status == sql.RUNNING, jobs.c.lease_expires_at > NOW, jobs.c.owner_id == _OWNER
)
BUCKET = select(rate_buckets).where(rate_buckets.c.kind == bindparam("kind"))

BUCKETS = select(rate_buckets).where(rate_buckets.c.kind.in_(bindparam("kinds", expanding=True)))


class SqlQueueView:
    """`steering.QueueView` on the claim's connection."""

    def __init__(self, conn: Connection, dialect: SqlDialect, kinds: KindFilter, now: datetime) -> None:
        self._conn = conn
        self._dialect = dialect
        self._kinds = kinds
        self._shape = kinds.shape
        self._params: dict[str, Any] = {"now": now}
        if kinds.only is not None:
            self._params["kinds"] = sorted(kinds.only)

    def running(self) -> steering.Running:
        by_owner: Counter[str] = Counter()
        by_kind: Counter[str] = Counter()
        for row in self._conn.execute(RUNNING_COUNTS, self._params):
            by_owner[row.owner_id] += row.running
            by_kind[row.kind] += row.running
        return steering.Running(by_owner, by_kind)

    def due_priorities(self) -> list[tuple[int, str | None]]:
        row = self._conn.execute(due_priorities(self._shape), self._params).one()
        found = []
        for index, priority in enumerate(PRIORITIES):
            first, last = row[2 * index], row[2 * index + 1]
            if first is not None:
                found.append((priority, first if first == last else None))
        return found

    def owners_with_due(self, priority: int, after: str, count: int) -> list[str]:
        found = self._owners(priority, after, count)
        if len(found) < count and after:
            # Round again from the first owner, up to where this scan began.
            found += [owner for owner in self._owners(priority, "", count - len(found)) if owner <= after]
        return found

    def _owners(self, priority: int, after: str, count: int) -> list[str]:
        params = {**self._params, "priority": priority, "after": after, "count": count}
        return list(self._conn.execute(owners_with_due(self._shape), params).scalars())

    def heads(
        self,
        priority: int,
        owner_id: str,
        blocked_kinds: frozenset[str],
        after: tuple[object, ...] | None,
        count: int,
    ) -> list[steering.Head]:
        params = {**self._params, "priority": priority, "owner": owner_id, "count": count}
        if blocked_kinds:
            params["blocked"] = sorted(blocked_kinds)
        if after is not None:
            params["after_at"], params["after_seq"] = after
        statement = heads(self._shape, bool(blocked_kinds), after is not None, self._dialect.locks_rows)
        return [
            steering.Head(row.id, row.kind, (row.available_at, row.seq))
            for row in self._conn.execute(statement, params)
        ]


def bucket_tokens(conn: Connection, rates: Mapping[str, steering.Rate], now: datetime) -> dict[str, float]:
    """What each rate-limited kind's bucket holds at `now`."""
    if not rates:
        return {}
    stored = {
        row.kind: steering.Bucket(row.tokens, row.refilled_at)
        for row in conn.execute(BUCKETS, {"kinds": sorted(rates)})
    }
    return {kind: steering.refill(stored.get(kind), rate, now) for kind, rate in rates.items()}


def spend_tokens(
    conn: Connection,
    dialect: SqlDialect,
    held: Mapping[str, float],
    spent: Counter[str],
    now: datetime,
) -> None:
    """Keep what each bucket a claim drew from holds now."""
    rows = [{"kind": kind, "tokens": held[kind] - count, "refilled_at": now} for kind, count in spent.items()]
    if rows:
        conn.execute(dialect.upsert_bucket, rows)

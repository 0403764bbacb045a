"""The claim's questions (`steering.QueueView`) as SQL, asked inside the claim's
write transaction, and the statements that act on the answer.

The first question (`claim_probe`) is one row of index seeks: which
priorities have due jobs, and whether the claim's recovery has work. Every
other question is an index seek on `ix_jobs_claim_order` (status, priority,
owner_id, available_at, seq): the owners with due jobs at a priority are found
by a loose index scan (a recursive query that jumps from one owner's oldest
due job to the next owner's, never reading an owner's other jobs), and an
owner's oldest due jobs are a range of that index, many owners' ranges read by
one statement. The claim then updates exactly the rows chosen.

A claim shared by many owners deals each of them a slot or two, so what it
costs is the number of statements, not their rows: on SQLite, whose claims
never run side by side, the scan's job for each owner is taken as found; on
PostgreSQL each job is read again by `heads`, which locks it.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Integer, String, bindparam, exists, func, literal, select, true, tuple_, union_all
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.selectable import CompoundSelect, Select

from leasehold._server.clock import Clock
from leasehold._server.jobs import steering
from leasehold._server.jobs.operations.rows import RecoveryDue
from leasehold._server.jobs.records import PRIORITIES
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql.dialect import SqlDialect
from leasehold._server.jobs.sql.planner_hints import not_an_index_bound
from leasehold._server.jobs.sql.tables import UtcTimestamp, jobs, rate_buckets
from leasehold._server.jobs.sql.transitions import NOW

_PRIORITY = bindparam("priority", type_=Integer())
_COUNT = bindparam("count", type_=Integer())
_OWNER = bindparam("owner", type_=String())

RUNNING_COUNTS = (
    select(jobs.c.owner_id, jobs.c.kind, func.count().label("running"))
    .where(jobs.c.status == sql.RUNNING, jobs.c.lease_expires_at > NOW)
    .group_by(jobs.c.owner_id, jobs.c.kind)
)


@functools.cache
def claim_probe(kinds: KindFilter) -> Select[Any]:
    """A claim's first question, one row: for each priority, its first and
    its last owner (in id order) with a due job `kinds` admits, or NULLs (two
    seeks of the claim order's index per priority, asked in that index's
    order, so no planner prefers a scan that a table of finished jobs would
    make slow); and whether any running job's lease expired (`expired`) or
    its deadline passed (`overdue`), one seek each, so a claim runs its
    recovery's statements only when they have work."""
    candidate = jobs.alias("candidate")

    def edge(priority: int, order: Any, label: str) -> Any:
        return (
            select(candidate.c.owner_id)
            .where(
                candidate.c.status == sql.QUEUED,
                candidate.c.priority == priority,
                not_an_index_bound(candidate.c.available_at) <= NOW,
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
        ),
        exists().where(sql.EXPIRED).label("expired"),
        exists().where(sql.OVERDUE).label("overdue"),
    )


@functools.cache
def owners_with_due(kinds: KindFilter, bounded: bool) -> Select[Any]:
    """Up to `count` owners after `after` (in id order) with a due job at
    `priority` that `kinds` admits, each with its oldest such job; `bounded`:
    none after `until` either. Each step
    seeks the next owner's oldest due job, so the scan costs one seek per owner
    found (and the scan itself is the first read of every owner's queue)."""
    candidate = jobs.alias("candidate")
    previous = jobs.alias("previous")

    def next_owner_head(after: Any) -> Any:
        return (
            select(candidate.c.seq)
            .where(
                candidate.c.status == sql.QUEUED,
                candidate.c.priority == _PRIORITY,
                candidate.c.owner_id > after,
                candidate.c.owner_id <= bindparam("until", type_=String()) if bounded else true(),
                not_an_index_bound(candidate.c.available_at) <= NOW,
                sql.kind_condition(kinds, candidate),
            )
            .order_by(candidate.c.owner_id, *sql.claim_order(candidate))
            .limit(1)
            .scalar_subquery()
        )

    start = select(
        next_owner_head(bindparam("after", type_=String())).label("seq"),
        literal(1, Integer()).label("found"),
    ).cte("owners", recursive=True)
    owner_of_previous = (
        select(previous.c.owner_id).where(previous.c.seq == start.c.seq).correlate(start).scalar_subquery()
    )
    step = select(next_owner_head(owner_of_previous), start.c.found + 1).where(
        start.c.seq.is_not(None), start.c.found < _COUNT
    )
    owners = start.union_all(step)
    return (
        select(jobs.c.owner_id, jobs.c.id, jobs.c.kind, *sql.claim_order())
        .join_from(owners, jobs, jobs.c.seq == owners.c.seq)
        .order_by(owners.c.found)
    )


# SQLite takes at most 500 terms in one compound SELECT; a claim asks for fewer
# owners at a time than this, in steps.
MAX_OWNERS_PER_HEADS = 64
# Where an owner read from its start is read after: before any job's place in
# the claim order (`seq` counts from 1). One form for every owner keeps the
# statements few.
_BEFORE_ANY_JOB = (datetime(1, 1, 1, tzinfo=UTC), 0)


def heads_members(owners: int) -> int:
    """How many owners the statement that reads `owners` of them has room for:
    a power of two, so a few statements serve every claim."""
    return 1 << max(owners - 1, 0).bit_length()


@functools.cache
def heads(kinds: KindFilter, blocking: bool, members: int, locks: bool) -> Select[Any] | CompoundSelect:
    """Each of `members` owners' due jobs at `priority`, in claim order: one
    index range per owner, joined by UNION ALL. Owner `i` is `owner_i`, read
    for up to `count_i` jobs after (`after_at_i`, `after_seq_i`); a member
    with nothing to read asks for none. `blocking`: none of the kinds in
    `blocked`; `locks`: rows other claims hold are skipped and the rest locked
    (PostgreSQL)."""
    parts = []
    for index in range(members):
        after = (
            bindparam(f"after_at_{index}", type_=UtcTimestamp()),
            bindparam(f"after_seq_{index}", type_=Integer()),
        )
        part = select(jobs.c.id, jobs.c.kind, jobs.c.owner_id, *sql.claim_order()).where(
            jobs.c.status == sql.QUEUED,
            jobs.c.priority == _PRIORITY,
            jobs.c.owner_id == bindparam(f"owner_{index}", type_=String()),
            jobs.c.available_at <= NOW,
            tuple_(*sql.claim_order()) > tuple_(*after),
            sql.kind_condition(kinds),
        )
        if blocking:
            part = part.where(jobs.c.kind.not_in(bindparam("blocked", expanding=True)))
        part = part.order_by(*sql.claim_order()).limit(bindparam(f"count_{index}", type_=Integer()))
        if locks:
            part = part.with_for_update(skip_locked=True)
        parts.append(part)
    if members == 1:
        return parts[0]
    # Each part keeps its own ORDER BY and LIMIT inside a subquery, which both
    # engines allow in a compound where a bare part's would not be.
    return union_all(*(select(part.subquery(f"owner_{index}")) for index, part in enumerate(parts)))


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

    def __init__(
        self, conn: Connection, dialect: SqlDialect, kinds: KindFilter, now: datetime, clock: Clock
    ) -> None:
        self._conn = conn
        self._dialect = dialect
        self._kinds = kinds
        self._shape = kinds.shape
        self._clock = clock
        self._params: dict[str, Any] = {"now": now}
        if kinds.only is not None:
            self._params["kinds"] = sorted(kinds.only)
        self._running: steering.Running | None = None
        self._probe: Row[Any] | None = None
        # When the running counts were read, if they were.
        self.counted_at: datetime | None = None

    def running(self) -> steering.Running:
        """Read once per claim."""
        if self._running is None:
            by_owner: Counter[str] = Counter()
            by_kind: Counter[str] = Counter()
            for row in self._conn.execute(RUNNING_COUNTS, self._params):
                by_owner[row.owner_id] += row.running
                by_kind[row.kind] += row.running
            self.counted_at = self._clock.now()
            self._running = steering.Running(by_owner, by_kind)
        return self._running

    def _probed(self) -> Row[Any]:
        if self._probe is None:
            self._probe = self._conn.execute(claim_probe(self._shape), self._params).one()
        return self._probe

    def recovery_due(self) -> RecoveryDue:
        row = self._probed()
        return RecoveryDue(expired=bool(row.expired), overdue=bool(row.overdue))

    def recovered(self) -> None:
        self._probe = None

    def due_priorities(self) -> list[tuple[int, str | None]]:
        row = self._probed()
        found = []
        for index, priority in enumerate(PRIORITIES):
            first, last = row[2 * index], row[2 * index + 1]
            if first is not None:
                found.append((priority, first if first == last else None))
        return found

    def owners_with_due(
        self, priority: int, after: str, count: int
    ) -> list[tuple[str, steering.Head | None]]:
        rows = self._owners(priority, after, count, None)
        if len(rows) < count and after:
            # Round again from the first owner, up to where this scan began.
            rows += self._owners(priority, "", count - len(rows), after)
        if self._dialect.locks_rows:
            # Claims run side by side here: a job is taken only as `heads` locks it.
            return [(row.owner_id, None) for row in rows]
        return [(row.owner_id, steering.Head(row.id, row.kind, (row.available_at, row.seq))) for row in rows]

    def _owners(self, priority: int, after: str, count: int, until: str | None) -> list[Row[Any]]:
        params = {**self._params, "priority": priority, "after": after, "count": count, "until": until}
        return list(self._conn.execute(owners_with_due(self._shape, until is not None), params))

    def heads(
        self,
        priority: int,
        wanted: Sequence[steering.HeadsWanted],
        blocked_kinds: frozenset[str],
    ) -> dict[str, list[steering.Head]]:
        found: dict[str, list[steering.Head]] = {want.owner_id: [] for want in wanted}
        for start in range(0, len(wanted), MAX_OWNERS_PER_HEADS):
            self._read_heads(priority, wanted[start : start + MAX_OWNERS_PER_HEADS], blocked_kinds, found)
        for owner_heads in found.values():
            owner_heads.sort(key=lambda head: head.position)  # type: ignore[arg-type,return-value]
        return found

    def _read_heads(
        self,
        priority: int,
        wanted: Sequence[steering.HeadsWanted],
        blocked_kinds: frozenset[str],
        found: dict[str, list[steering.Head]],
    ) -> None:
        members = heads_members(len(wanted))
        params = {**self._params, "priority": priority}
        if blocked_kinds:
            params["blocked"] = sorted(blocked_kinds)
        for index in range(members):
            want = wanted[index] if index < len(wanted) else None
            params[f"owner_{index}"] = want.owner_id if want else wanted[0].owner_id
            params[f"count_{index}"] = want.count if want else 0
            params[f"after_at_{index}"], params[f"after_seq_{index}"] = (
                want.after if want and want.after is not None else _BEFORE_ANY_JOB
            )
        statement = heads(self._shape, bool(blocked_kinds), members, self._dialect.locks_rows)
        for row in self._conn.execute(statement, params):
            found[row.owner_id].append(steering.Head(row.id, row.kind, (row.available_at, row.seq)))


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
    spent: Mapping[str, int],
    now: datetime,
) -> None:
    """Keep what each bucket a claim drew from holds now."""
    rows = [{"kind": kind, "tokens": held[kind] - count, "refilled_at": now} for kind, count in spent.items()]
    if rows:
        conn.execute(dialect.upsert_bucket, rows)

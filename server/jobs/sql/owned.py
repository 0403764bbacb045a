"""The per-owner limits' reads on the SQL engines (`owner_limits`), one form
for SQLite and PostgreSQL alike.

Which values an owner already has is a probe of the owner's index per value
(`ix_jobs_owner_id_kind_status`, `ix_jobs_owner_id_resource`). How many
distinct values the owner has is a loose index scan written as a recursive
CTE: each step asks the index for the owner's next value above the last one
(one probe), and the recursion stops after `up_to` steps, so the count costs
at most `up_to` probes however many jobs the owner has. The seed is the empty
string, which no kind is and which stands for "no resource type", so the scan
starts at the first real value.
"""

from __future__ import annotations

from sqlalchemy import Column, Integer, String, bindparam, cast, func, literal_column, select
from sqlalchemy.sql.selectable import Select

from leasehold._server.jobs.owner_limits import OwnedField
from leasehold._server.jobs.sql.tables import jobs, schedules

_OWNER = bindparam("owner", type_=String())
_UP_TO = bindparam("up_to", type_=Integer())


def _column(owned: OwnedField) -> Column[str]:
    return jobs.c[owned.value]


def _known(owned: OwnedField) -> Select[str]:
    column = _column(owned)
    return (
        select(column)
        .distinct()
        .where(jobs.c.owner_id == _OWNER, column.in_(bindparam("among", expanding=True)))
    )


def _count_distinct(owned: OwnedField) -> Select[int]:
    column = _column(owned)
    # The seed's types are the column's own and a plain integer: PostgreSQL
    # requires the recursive term's to match them exactly.
    seen = select(
        cast(literal_column("''"), column.type).label("value"), literal_column("0").label("step")
    ).cte("seen", recursive=True)
    following = (
        select(column)
        .where(jobs.c.owner_id == _OWNER, column > seen.c.value)
        .order_by(column)
        .limit(1)
        .scalar_subquery()
    )
    seen = seen.union_all(
        select(following, seen.c.step + 1).where(seen.c.value.is_not(None), seen.c.step < _UP_TO)
    )
    return select(func.count()).select_from(seen).where(seen.c.step > 0, seen.c.value.is_not(None))


KNOWN = {owned: _known(owned) for owned in OwnedField}
COUNT_DISTINCT = {owned: _count_distinct(owned) for owned in OwnedField}

_OWN_SCHEDULES = (
    select(schedules.c.schedule_id).where(schedules.c.owner_id == _OWNER).limit(_UP_TO).subquery()
)
COUNT_SCHEDULES = select(func.count()).select_from(_OWN_SCHEDULES)

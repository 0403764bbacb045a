"""Schedules on the SQL engines: the statements, and reading and writing a
schedule's row.

What a firing does is `schedules.plan_firing`'s decision (taken above the
engines); this module only stores it, in the same transaction as the firing's
job. On PostgreSQL the due scan
locks the rows it takes with SKIP LOCKED, so replicas firing at the same
moment split the due schedules between them instead of queueing on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Integer, and_, bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from leasehold._server.jobs import schedules as sch
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import ScheduleExists
from leasehold._server.jobs.sql.tables import jobs, schedules

_OWNED = and_(schedules.c.owner_id == bindparam("owner"), schedules.c.schedule_id == bindparam("sid"))
_COLUMNS = [column for column in schedules.c if column.name != "seq"]

GET = select(*_COLUMNS).where(_OWNED)
GET_FOR_UPDATE = GET.with_for_update()
LIST = (
    select(*_COLUMNS)
    .where(schedules.c.owner_id == bindparam("owner"), schedules.c.schedule_id > bindparam("after"))
    .order_by(schedules.c.schedule_id)
    .limit(bindparam("limit", type_=Integer()))
)
INSERT = insert(schedules)
# What changes after creation: its pause, and what its firings did.
_CHANGING = (
    "paused",
    "next_fire_at",
    "last_fire_at",
    "last_job_id",
    "skipped_firings",
    "last_skipped_fire_at",
    "last_skip_reason",
    "updated_at",
)
STORE = update(schedules).where(_OWNED).values({name: bindparam(f"v_{name}") for name in _CHANGING})
DELETE = delete(schedules).where(_OWNED)
_DUE = (
    select(*_COLUMNS)
    .where(schedules.c.next_fire_at <= bindparam("now"))
    .order_by(schedules.c.next_fire_at)
    .limit(bindparam("limit", type_=Integer()))
)
DUE: dict[bool, Any] = {False: _DUE, True: _DUE.with_for_update(skip_locked=True)}
NEXT_FIRE_AT = select(func.min(schedules.c.next_fire_at))
JOB_STATUS = select(jobs.c.status).where(jobs.c.id == bindparam("job_id"))


def schedule_from_row(row: Any) -> sch.Schedule:
    m: Mapping[str, Any] = row._mapping
    reason = m["last_skip_reason"]
    return sch.Schedule(
        owner_id=m["owner_id"],
        schedule_id=m["schedule_id"],
        cron=m["cron"],
        time_zone=m["time_zone"],
        template=sch.JobTemplate(
            kind=m["kind"],
            payload=m["payload"],
            max_attempts=m["max_attempts"],
            timeout_seconds=m["timeout_seconds"],
            priority=m["priority"],
            retry_policy=sm.retry_policy_of(m),
        ),
        overlap=sch.OverlapPolicy(m["overlap"]),
        catchup_window_seconds=m["catchup_window_seconds"],
        paused=bool(m["paused"]),
        next_fire_at=m["next_fire_at"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        last_fire_at=m["last_fire_at"],
        last_job_id=m["last_job_id"],
        skipped_firings=m["skipped_firings"],
        last_skipped_fire_at=m["last_skipped_fire_at"],
        last_skip_reason=sch.SkipReason(reason) if reason else None,
    )


def insert_new(conn: Connection, schedule: sch.Schedule) -> sch.Schedule:
    """Insert a new schedule and read it back, or ScheduleExists when its owner
    already has the id. The unique index decides (two replicas creating it at
    once), inside a savepoint of its own so the refusal leaves the batch's
    transaction usable."""
    template = schedule.template
    values = {
        "owner_id": schedule.owner_id,
        "schedule_id": schedule.schedule_id,
        "cron": schedule.cron,
        "time_zone": schedule.time_zone,
        "kind": template.kind,
        "payload": template.payload,
        "max_attempts": template.max_attempts,
        "timeout_seconds": template.timeout_seconds,
        "priority": template.priority,
        **sm.policy_columns(template.retry_policy),
        "overlap": schedule.overlap.value,
        "catchup_window_seconds": schedule.catchup_window_seconds,
        "paused": schedule.paused,
        "next_fire_at": schedule.next_fire_at,
        "skipped_firings": schedule.skipped_firings,
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
    }
    conn.exec_driver_sql("SAVEPOINT schedule_insert")
    try:
        conn.execute(INSERT, values)
    except IntegrityError:
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT schedule_insert")
        conn.exec_driver_sql("RELEASE SAVEPOINT schedule_insert")
        raise ScheduleExists(schedule.schedule_id) from None
    conn.exec_driver_sql("RELEASE SAVEPOINT schedule_insert")
    found = owned(conn, schedule.owner_id, schedule.schedule_id)
    assert found is not None
    return found


def owned(conn: Connection, owner_id: str, schedule_id: str, for_update: bool = False) -> sch.Schedule | None:
    """The owner's schedule; another owner's is as missing as an unknown id."""
    statement = GET_FOR_UPDATE if for_update else GET
    row = conn.execute(statement, {"owner": owner_id, "sid": schedule_id}).first()
    return None if row is None else schedule_from_row(row)


def store(conn: Connection, schedule: sch.Schedule) -> None:
    """Write what a pause, resume, firing or trigger changed in `schedule`."""
    reason = schedule.last_skip_reason
    values = {
        "paused": schedule.paused,
        "next_fire_at": schedule.next_fire_at,
        "last_fire_at": schedule.last_fire_at,
        "last_job_id": schedule.last_job_id,
        "skipped_firings": schedule.skipped_firings,
        "last_skipped_fire_at": schedule.last_skipped_fire_at,
        "last_skip_reason": reason.value if reason else None,
        "updated_at": schedule.updated_at,
    }
    conn.execute(
        STORE,
        {"owner": schedule.owner_id, "sid": schedule.schedule_id, **{f"v_{k}": v for k, v in values.items()}},
    )

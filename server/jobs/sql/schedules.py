"""Schedules and retention on the SQL engines: the statements, and the parts of
the writer's operations that read and write schedule rows.

What a firing does is `schedules.plan_firing`'s decision; this module only
stores it, in the same transaction as the firing's job (which the repository
inserts with the resource-key dedup of Enqueue). On PostgreSQL the due scan
locks the rows it takes with SKIP LOCKED, so replicas firing at the same
moment split the due schedules between them instead of queueing on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, and_, bindparam, delete, exists, func, insert, not_, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from leasehold._server.jobs import schedules as sch
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import ScheduleExists, ScheduleNotFound
from leasehold._server.jobs.records import TERMINAL_STATUSES, JobStatus
from leasehold._server.jobs.sql.tables import job_events, jobs, schedules

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

# ----- retention ---------------------------------------------------------------------

_TERMINAL = sorted(status.value for status in TERMINAL_STATUSES)
_CUTOFF: Any = bindparam("cutoff")
_sibling = jobs.alias("sibling")
# A job with a resource key goes only with every job of its key: deleting a
# finished root while its retry still runs would free the key for a second
# root job, and Enqueue's "one root per resource" would no longer hold.
_KEY_STILL_IN_USE = exists(
    select(1)
    .select_from(_sibling)
    .where(
        _sibling.c.owner_id == jobs.c.owner_id,
        _sibling.c.resource_type == jobs.c.resource_type,
        _sibling.c.resource_id == jobs.c.resource_id,
        or_(
            _sibling.c.status.not_in(_TERMINAL),
            _sibling.c.completed_at >= _CUTOFF,
            _sibling.c.completed_at.is_(None),
        ),
    )
)
_EXPIRED_ROWS = and_(jobs.c.status.in_(_TERMINAL), jobs.c.completed_at < _CUTOFF)
_LIMIT = bindparam("limit", type_=Integer())
# Two statements, not one with "resource_id = '' OR NOT EXISTS (...)": under
# the OR, PostgreSQL hashes the whole subquery, a scan of every job per batch;
# alone, the NOT EXISTS is an anti-join probing ix_jobs_owner_id_resource.
_EXPIRED_UNKEYED = select(jobs.c.id).where(_EXPIRED_ROWS, jobs.c.resource_id == "").limit(_LIMIT)
_EXPIRED_KEYED = (
    select(jobs.c.id).where(_EXPIRED_ROWS, jobs.c.resource_id != "", not_(_KEY_STILL_IN_USE)).limit(_LIMIT)
)
EXPIRED: dict[bool, tuple[Any, ...]] = {
    False: (_EXPIRED_UNKEYED, _EXPIRED_KEYED),
    True: tuple(
        statement.with_for_update(of=jobs, skip_locked=True)
        for statement in (_EXPIRED_UNKEYED, _EXPIRED_KEYED)
    ),
}
_IDS: Any = bindparam("ids", expanding=True)
DELETE_EVENTS = delete(job_events).where(job_events.c.job_id.in_(_IDS))
# The status is checked again, so a row is never deleted unless it is finished,
# as "not live" rather than "terminal": SQLite, with no statistics, would walk
# ix_jobs_status_completed_at across every finished job to serve "status IN
# (terminal)" instead of looking the batch's ids up (a NOT IN uses no index).
_LIVE = sorted(status.value for status in JobStatus if status not in TERMINAL_STATUSES)
DELETE_JOBS = delete(jobs).where(jobs.c.id.in_(_IDS), jobs.c.status.not_in(_LIVE))


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


def create(conn: Connection, new: sch.NewSchedule, now: datetime) -> sch.Schedule:
    """Insert the schedule, or ScheduleExists when its owner already has the id.
    The unique index decides (two replicas creating it at once), inside a
    savepoint of its own so the refusal leaves the batch's transaction usable."""
    template = new.template
    values = {
        "owner_id": new.owner_id,
        "schedule_id": new.schedule_id,
        "cron": new.rule.expression,
        "time_zone": new.rule.zone_name,
        "kind": template.kind,
        "payload": template.payload,
        "max_attempts": template.max_attempts,
        "timeout_seconds": template.timeout_seconds,
        "priority": template.priority,
        **sm.policy_columns(template.retry_policy),
        "overlap": new.overlap.value,
        "catchup_window_seconds": new.catchup_window_seconds,
        "paused": new.paused,
        "next_fire_at": None if new.paused else new.rule.next_after(now),
        "skipped_firings": 0,
        "created_at": now,
        "updated_at": now,
    }
    conn.exec_driver_sql("SAVEPOINT schedule_insert")
    try:
        conn.execute(INSERT, values)
    except IntegrityError:
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT schedule_insert")
        conn.exec_driver_sql("RELEASE SAVEPOINT schedule_insert")
        raise ScheduleExists(new.schedule_id) from None
    conn.exec_driver_sql("RELEASE SAVEPOINT schedule_insert")
    return owned(conn, new.owner_id, new.schedule_id)


def owned(conn: Connection, owner_id: str, schedule_id: str, for_update: bool = False) -> sch.Schedule:
    """The owner's schedule; another owner's is as missing as an unknown id."""
    statement = GET_FOR_UPDATE if for_update else GET
    row = conn.execute(statement, {"owner": owner_id, "sid": schedule_id}).first()
    if row is None:
        raise ScheduleNotFound(schedule_id)
    return schedule_from_row(row)


def store(conn: Connection, schedule: sch.Schedule) -> sch.Schedule:
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
    return schedule


def previous_running(conn: Connection, schedule: sch.Schedule) -> bool:
    """Whether the job of the schedule's last firing is still queued or running
    (a job retention deleted is neither)."""
    if schedule.last_job_id is None:
        return False
    status = conn.execute(JOB_STATUS, {"job_id": schedule.last_job_id}).scalar()
    return status in (JobStatus.QUEUED.value, JobStatus.RUNNING.value)

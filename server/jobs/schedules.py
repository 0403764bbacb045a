"""Recurring schedules (DESIGN §12): what a schedule holds, and what a firing does.

Engines store schedules and run `plan_firing` inside the transaction that
enqueues the firing's job and moves the schedule on, so one rule decides
catch-up and overlap on every engine. Exactly one job per firing across
replicas comes from the resource key (`firing_resource`): a replica that
raced another to the same firing finds the other's job, as a repeated
Enqueue does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from leasehold._server.jobs.cron import CronRule
from leasehold._server.jobs.records import DEFAULT_PRIORITY, JsonObject, NewJob, RetryPolicy
from leasehold._server.jobs.state_machine import rfc3339

# Every firing's job carries this resource type; Enqueue refuses it from callers.
SCHEDULE_RESOURCE_TYPE = "leasehold.schedule"
# A firing reached this late is still on time, whatever the catch-up window:
# the timer wakes a little after a fire time, and a replica taking over from
# one that died notices the firing only at its next look (`SCHEDULE_POLL_SECONDS`).
ON_TIME_SECONDS = 15.0
# How often each replica looks for due schedules at the latest, so a schedule
# created or resumed on another replica fires on time here too.
SCHEDULE_POLL_SECONDS = 5.0
MAX_CATCHUP_WINDOW_SECONDS = 365 * 86_400
# Skipped firings counted one by one in a single decision, inside the
# firing's write transaction; past this (a minutely schedule down for a day)
# the count stops, as docs/schedules.md says, rather than hold the writer.
MAX_COUNTED_FIRINGS = 1_000


class OverlapPolicy(StrEnum):
    SKIP = "skip"
    ALLOW = "allow"


class SkipReason(StrEnum):
    CATCHUP_WINDOW = "catchup_window"
    OVERLAP = "overlap"


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """What each firing enqueues; checked by Enqueue's rules when stored."""

    kind: str
    payload: JsonObject
    max_attempts: int = 3
    timeout_seconds: int = 900
    priority: int = DEFAULT_PRIORITY
    retry_policy: RetryPolicy | None = None


@dataclass(frozen=True, slots=True)
class NewSchedule:
    owner_id: str
    schedule_id: str
    rule: CronRule
    template: JobTemplate
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    catchup_window_seconds: int = 0
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Schedule:
    owner_id: str
    schedule_id: str
    cron: str
    time_zone: str
    template: JobTemplate
    overlap: OverlapPolicy
    catchup_window_seconds: int
    paused: bool
    # None while paused, or once the rule never fires again.
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_fire_at: datetime | None = None
    last_job_id: str | None = None
    skipped_firings: int = 0
    last_skipped_fire_at: datetime | None = None
    last_skip_reason: SkipReason | None = None

    @property
    def rule(self) -> CronRule:
        return _rule(self.cron, self.time_zone)


@functools.lru_cache(maxsize=1024)
def _rule(cron: str, time_zone: str) -> CronRule:
    # Stored rules were checked when created; parsing again only rebuilds them.
    return CronRule.parse(cron, time_zone)


@dataclass(frozen=True, slots=True)
class SchedulePage:
    schedules: list[Schedule]
    # The last schedule_id of this page when more follow.
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Firing:
    """What one firing decision does to a due schedule."""

    # The fire time whose job to enqueue, or None when every due firing is skipped.
    fire_at: datetime | None
    skipped: int
    last_skipped_fire_at: datetime | None
    last_skip_reason: SkipReason | None
    next_fire_at: datetime | None


def plan_firing(schedule: Schedule, now: datetime, previous_running: bool) -> Firing:
    """The due firings of `schedule` (from its next_fire_at up to `now`):

    - only the latest may enqueue a job, and only if it is at most
      max(catchup_window_seconds, ON_TIME_SECONDS) old; every earlier one (and
      the latest, if older) is skipped for the catch-up window;
    - with overlap SKIP, the latest is skipped too while the previous firing's
      job is still queued or running (`previous_running`).
    """
    rule = schedule.rule
    due = schedule.next_fire_at
    assert due is not None and due <= now, "plan_firing takes a due schedule"
    latest = max(rule.latest_at_or_before(now) or due, due)
    count, moment = 1, due
    while moment < latest and count < MAX_COUNTED_FIRINGS:
        following = rule.next_after(moment)
        if following is None or following > latest:
            break
        moment, count = following, count + 1
    window = max(float(schedule.catchup_window_seconds), ON_TIME_SECONDS)
    on_time = now - latest <= timedelta(seconds=window)
    fire_at: datetime | None = latest if on_time else None
    skipped = count - (1 if on_time else 0)
    reason = SkipReason.CATCHUP_WINDOW if skipped else None
    last_skipped = None
    if skipped:
        last_skipped = latest if not on_time else rule.latest_at_or_before(latest - _TICK)
    if fire_at is not None and schedule.overlap is OverlapPolicy.SKIP and previous_running:
        skipped, last_skipped, reason, fire_at = skipped + 1, fire_at, SkipReason.OVERLAP, None
    return Firing(
        fire_at=fire_at,
        skipped=skipped,
        last_skipped_fire_at=last_skipped,
        last_skip_reason=reason,
        next_fire_at=rule.next_after(now),
    )


_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class FiringOutcome:
    """What one firing decision did, for the timer's log."""

    owner_id: str
    schedule_id: str
    # The firing enqueued (or found already enqueued by another replica), if any.
    fire_at: datetime | None
    job_id: str | None
    skipped: int
    skip_reason: SkipReason | None


@dataclass(frozen=True, slots=True)
class FiringRound:
    outcomes: list[FiringOutcome]
    # The earliest next fire time of any schedule left, or None.
    next_fire_at: datetime | None


def outcome(schedule: Schedule, firing: Firing, job_id: str | None) -> FiringOutcome:
    return FiringOutcome(
        owner_id=schedule.owner_id,
        schedule_id=schedule.schedule_id,
        fire_at=firing.fire_at,
        job_id=job_id,
        skipped=firing.skipped,
        skip_reason=firing.last_skip_reason,
    )


def after_firing(schedule: Schedule, firing: Firing, job_id: str | None, now: datetime) -> Schedule:
    """`schedule` as `firing` leaves it, `job_id` being the job it enqueued."""
    changes: dict[str, Any] = {"next_fire_at": firing.next_fire_at, "updated_at": now}
    if firing.fire_at is not None:
        changes.update(last_fire_at=firing.fire_at, last_job_id=job_id)
    if firing.skipped:
        changes.update(
            skipped_firings=schedule.skipped_firings + firing.skipped,
            last_skipped_fire_at=firing.last_skipped_fire_at,
            last_skip_reason=firing.last_skip_reason,
        )
    return replace(schedule, **changes)


def created(new: NewSchedule, now: datetime) -> Schedule:
    """The schedule `new` makes at `now`: its first fire time the rule's next
    after now, unless it starts paused."""
    return Schedule(
        owner_id=new.owner_id,
        schedule_id=new.schedule_id,
        cron=new.rule.expression,
        time_zone=new.rule.zone_name,
        template=new.template,
        overlap=new.overlap,
        catchup_window_seconds=new.catchup_window_seconds,
        paused=new.paused,
        next_fire_at=None if new.paused else new.rule.next_after(now),
        created_at=now,
        updated_at=now,
    )


def paused_at(schedule: Schedule, paused: bool, now: datetime) -> Schedule:
    """`schedule` paused (no next firing) or resumed (from the rule's next fire
    time after `now`: the firings missed while paused are not made up)."""
    next_fire_at = None if paused else schedule.rule.next_after(now)
    return replace(schedule, paused=paused, next_fire_at=next_fire_at, updated_at=now)


def triggered(schedule: Schedule, job_id: str, now: datetime) -> Schedule:
    """`schedule` after a trigger at `now` enqueued `job_id`."""
    return replace(schedule, last_fire_at=now, last_job_id=job_id, updated_at=now)


def firing_resource(schedule_id: str, fire_at: datetime) -> tuple[str, str]:
    """The resource key of a firing: every replica names a firing alike."""
    return SCHEDULE_RESOURCE_TYPE, f"{schedule_id}@{rfc3339(fire_at)}"


def firing_job(schedule: Schedule, fire_at: datetime) -> NewJob:
    """The job a firing of `schedule` at `fire_at` enqueues."""
    resource_type, resource_id = firing_resource(schedule.schedule_id, fire_at)
    template = schedule.template
    return NewJob(
        owner_id=schedule.owner_id,
        kind=template.kind,
        payload=template.payload,
        resource_type=resource_type,
        resource_id=resource_id,
        max_attempts=template.max_attempts,
        timeout_seconds=template.timeout_seconds,
        priority=template.priority,
        retry_policy=template.retry_policy,
    )

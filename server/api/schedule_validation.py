"""ScheduleService requests as domain inputs, or INVALID_ARGUMENT naming the field.

The job template is checked by Enqueue's own rules (`validation.new_job`), so a
schedule refuses what Enqueue would refuse, in the same words, with the field
named under `job.`.
"""

from __future__ import annotations

import re
from datetime import datetime

from leasehold._server.api import validation
from leasehold._server.jobs import schedules
from leasehold._server.jobs.cron import CronRule
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.routing import ServedKinds
from leasehold.v1 import jobs_pb2, schedules_pb2

# No "@": a firing's resource id is `<schedule_id>@<fire time>`.
_SCHEDULE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
CRON_LIMIT = 256
# The longest IANA zone name has 32 characters; checked before the name is
# looked up or echoed in an error.
TIME_ZONE_LIMIT = 64

OVERLAP_FROM_PROTO = {
    schedules_pb2.OVERLAP_POLICY_UNSPECIFIED: schedules.OverlapPolicy.SKIP,
    schedules_pb2.OVERLAP_POLICY_SKIP: schedules.OverlapPolicy.SKIP,
    schedules_pb2.OVERLAP_POLICY_ALLOW: schedules.OverlapPolicy.ALLOW,
}


def schedule_id(value: str) -> str:
    if not _SCHEDULE_ID.fullmatch(value):
        raise InvalidArgument("schedule_id", "must be 1-128 characters of [A-Za-z0-9._-]")
    return value


def new_schedule(
    owner_id: str,
    request: schedules_pb2.CreateScheduleRequest,
    serves: ServedKinds,
    now: datetime,
) -> schedules.NewSchedule:
    """`serves(kind)`: whether a local handler or a remote-kind pattern serves it."""
    if len(request.cron) > CRON_LIMIT:
        raise InvalidArgument("cron", f"must be at most {CRON_LIMIT} characters")
    if len(request.time_zone) > TIME_ZONE_LIMIT:
        raise InvalidArgument("time_zone", f"must be at most {TIME_ZONE_LIMIT} characters")
    rule = CronRule.parse(request.cron, request.time_zone)
    if rule.next_after(now) is None:
        raise InvalidArgument(
            "cron",
            f"{rule.expression!r} never fires in {rule.zone_name} (its clock changes skip every match)",
        )
    if request.overlap not in OVERLAP_FROM_PROTO:
        raise InvalidArgument("overlap", f"unknown overlap policy {request.overlap}")
    window = request.catchup_window_seconds
    if not 0 <= window <= schedules.MAX_CATCHUP_WINDOW_SECONDS:
        raise InvalidArgument(
            "catchup_window_seconds", f"must be between 0 and {schedules.MAX_CATCHUP_WINDOW_SECONDS}"
        )
    return schedules.NewSchedule(
        owner_id=owner_id,
        schedule_id=schedule_id(request.schedule_id),
        rule=rule,
        template=job_template(owner_id, request, serves, now),
        overlap=OVERLAP_FROM_PROTO[request.overlap],
        catchup_window_seconds=window,
        paused=request.paused,
    )


def job_template(
    owner_id: str,
    request: schedules_pb2.CreateScheduleRequest,
    serves: ServedKinds,
    now: datetime,
) -> schedules.JobTemplate:
    if not request.HasField("job"):
        raise InvalidArgument("job", "is required")
    job = request.job
    as_enqueue = jobs_pb2.EnqueueRequest(
        kind=job.kind,
        payload=job.payload,
        max_attempts=job.max_attempts,
        timeout_seconds=job.timeout_seconds,
        priority=job.priority,
        retry_policy=job.retry_policy if job.HasField("retry_policy") else None,
    )
    try:
        checked = validation.new_job(owner_id, as_enqueue, serves, now)
    except InvalidArgument as exc:
        raise InvalidArgument(f"job.{exc.field}", exc.description) from None
    return schedules.JobTemplate(
        kind=checked.kind,
        payload=checked.payload,
        max_attempts=checked.max_attempts,
        timeout_seconds=checked.timeout_seconds,
        priority=checked.priority,
        retry_policy=checked.retry_policy,
    )

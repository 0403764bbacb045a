"""Domain records to protobuf messages and back."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.owner_feed import encode_position
from leasehold._server.jobs.records import (
    FeedEvent,
    Job,
    JobEvent,
    JobStatus,
    JsonObject,
    ParentFailurePolicy,
    RetryPolicy,
    WaitReason,
)
from leasehold._server.jobs.schedules import OverlapPolicy, Schedule, SkipReason
from leasehold._server.jobs.state_machine import AWAITING_PARENTS
from leasehold.client._json import EXACT_INTEGER_LIMIT
from leasehold.v1 import jobs_pb2, schedules_pb2

STATUS_TO_PROTO = {
    JobStatus.QUEUED: jobs_pb2.JOB_STATUS_QUEUED,
    JobStatus.RUNNING: jobs_pb2.JOB_STATUS_RUNNING,
    JobStatus.SUCCEEDED: jobs_pb2.JOB_STATUS_SUCCEEDED,
    JobStatus.FAILED: jobs_pb2.JOB_STATUS_FAILED,
    JobStatus.CANCELLED: jobs_pb2.JOB_STATUS_CANCELLED,
}
STATUS_FROM_PROTO = {proto: status for status, proto in STATUS_TO_PROTO.items()}

WAIT_REASON_TO_PROTO = {
    reason: jobs_pb2.WaitReason.Value(f"WAIT_REASON_{reason.name}") for reason in WaitReason
}

PARENT_FAILURE_TO_PROTO = {
    ParentFailurePolicy.CANCEL: jobs_pb2.PARENT_FAILURE_POLICY_CANCEL,
    ParentFailurePolicy.RUN: jobs_pb2.PARENT_FAILURE_POLICY_RUN,
}
# What an Enqueue may ask for: UNSPECIFIED is the default, CANCEL.
PARENT_FAILURE_FROM_PROTO: dict[int, ParentFailurePolicy] = {
    jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED: ParentFailurePolicy.CANCEL,
    **{proto: policy for policy, proto in PARENT_FAILURE_TO_PROTO.items()},
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """`Timestamp.FromDatetime` goes through a time tuple; the difference from
    the epoch is exact and about a quarter of the cost, which counts on every
    event a watch stream sends. A naive datetime is UTC, as FromDatetime reads it."""
    if value is None:
        return None
    delta = (value if value.tzinfo is not None else value.replace(tzinfo=UTC)) - _EPOCH
    seconds = delta.days * 86_400 + delta.seconds
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=delta.microseconds * 1000)


def job_to_proto(job: Job, wait_reason: WaitReason | None = None) -> jobs_pb2.Job:
    """`wait_reason`: only Get's, for a queued job.

    A job still waiting for parents has no time it falls due (the store keeps
    a far-future stand-in so that claims pass it by), nor has one a parent's
    failure ended while it waited: its available_at is left unset rather than
    shown as a date nobody meant."""
    return jobs_pb2.Job(
        id=job.id,
        kind=job.kind,
        resource_type=job.resource_type,
        resource_id=job.resource_id,
        status=STATUS_TO_PROTO[job.status],
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        timeout_seconds=job.timeout_seconds,
        available_at=None
        if job.pending_dependencies > 0 or job.available_at >= AWAITING_PARENTS
        else timestamp(job.available_at),
        cancel_requested_at=timestamp(job.cancel_requested_at),
        retry_of_job_id=job.retry_of_job_id or "",
        error_message=job.error_message or "",
        error_type=job.error_type or "",
        created_at=timestamp(job.created_at),
        updated_at=timestamp(job.updated_at),
        started_at=timestamp(job.started_at),
        completed_at=timestamp(job.completed_at),
        result=None if job.result is None else dict_to_struct(job.result),
        run_at=timestamp(job.run_at),
        priority=job.priority,
        retry_policy=None if job.retry_policy is None else retry_policy_to_proto(job.retry_policy),
        wait_reason=jobs_pb2.WAIT_REASON_UNSPECIFIED
        if wait_reason is None
        else WAIT_REASON_TO_PROTO[wait_reason],
        owner_id=job.owner_id,
        depends_on=job.depends_on,
        pending_dependencies=job.pending_dependencies,
        on_parent_failure=jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED
        if job.on_parent_failure is None
        else PARENT_FAILURE_TO_PROTO[job.on_parent_failure],
    )


def retry_policy_to_proto(policy: RetryPolicy) -> jobs_pb2.RetryPolicy:
    return jobs_pb2.RetryPolicy(
        initial_interval_seconds=policy.initial_interval_seconds,
        backoff_coefficient=policy.backoff_coefficient,
        max_interval_seconds=policy.max_interval_seconds,
        non_retryable_error_types=policy.non_retryable_error_types,
    )


OVERLAP_TO_PROTO = {
    OverlapPolicy.SKIP: schedules_pb2.OVERLAP_POLICY_SKIP,
    OverlapPolicy.ALLOW: schedules_pb2.OVERLAP_POLICY_ALLOW,
}
SKIP_REASON_TO_PROTO = {
    SkipReason.CATCHUP_WINDOW: schedules_pb2.SKIP_REASON_CATCHUP_WINDOW,
    SkipReason.OVERLAP: schedules_pb2.SKIP_REASON_OVERLAP,
}


def schedule_to_proto(schedule: Schedule) -> schedules_pb2.Schedule:
    template = schedule.template
    return schedules_pb2.Schedule(
        schedule_id=schedule.schedule_id,
        cron=schedule.cron,
        time_zone=schedule.time_zone,
        job=schedules_pb2.ScheduleJob(
            kind=template.kind,
            payload=dict_to_struct(template.payload),
            max_attempts=template.max_attempts,
            timeout_seconds=template.timeout_seconds,
            priority=template.priority,
            retry_policy=None
            if template.retry_policy is None
            else retry_policy_to_proto(template.retry_policy),
        ),
        overlap=OVERLAP_TO_PROTO[schedule.overlap],
        catchup_window_seconds=schedule.catchup_window_seconds,
        paused=schedule.paused,
        next_fire_at=timestamp(schedule.next_fire_at),
        last_fire_at=timestamp(schedule.last_fire_at),
        last_job_id=schedule.last_job_id or "",
        skipped_firings=schedule.skipped_firings,
        last_skipped_fire_at=timestamp(schedule.last_skipped_fire_at),
        last_skip_reason=schedules_pb2.SKIP_REASON_UNSPECIFIED
        if schedule.last_skip_reason is None
        else SKIP_REASON_TO_PROTO[schedule.last_skip_reason],
        created_at=timestamp(schedule.created_at),
        updated_at=timestamp(schedule.updated_at),
    )


def event_to_proto(event: JobEvent) -> jobs_pb2.JobEvent:
    return jobs_pb2.JobEvent(
        job_id=event.job_id,
        sequence=event.sequence,
        type=event.type,
        payload=dict_to_struct(event.payload),
        created_at=timestamp(event.created_at),
    )


def feed_event_to_proto(numbered: FeedEvent) -> jobs_pb2.SubscribeResponse:
    subject = numbered.subject
    return jobs_pb2.SubscribeResponse(
        event=event_to_proto(numbered.event),
        position=encode_position(numbered.position),
        kind=subject.kind,
        resource_type=subject.resource_type,
        resource_id=subject.resource_id,
    )


def dict_to_struct(value: JsonObject) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct


def struct_to_dict(struct: struct_pb2.Struct, field: str = "payload") -> JsonObject:
    """The Struct as Python values, for a handler or a Python caller.

    A Struct carries every number as a double, so `{"n": 3}` would reach a
    handler as `3.0` and `range(ctx.payload["n"])` would fail; integral numbers
    within +-2**53 become `int`, as a JSON parser would give them, by the same
    rule the client applies for its callers (`integral_numbers_as_int`).

    One walk converts and checks: a `Value` with no kind set (a generator's
    default, easily sent by mistake) is refused as INVALID_ARGUMENT naming its
    path under `field` (`payload.items[2].name`), rather than stored as null,
    which the sender never meant. Raises ValueError for NaN or an infinity
    (JSON has none)."""
    return _struct_fields(struct, field)


def _struct_fields(struct: struct_pb2.Struct, path: str) -> JsonObject:
    return {key: _value(item, _key_path(path, key)) for key, item in struct.fields.items()}


def _value(value: struct_pb2.Value, path: str) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            raise ValueError(f"{path}: numbers must be finite")
        if number.is_integer() and abs(number) <= EXACT_INTEGER_LIMIT:
            return int(number)
        return number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return _struct_fields(value.struct_value, path)
    if kind == "list_value":
        return [_value(item, f"{path}[{index}]") for index, item in enumerate(value.list_value.values)]
    if kind == "null_value":
        return None
    raise InvalidArgument(path, "is a Value with no kind set (send null_value for a null)")


def _key_path(path: str, key: str) -> str:
    """`payload.name` for a plain key, `payload["odd key"]` for any other."""
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"

"""Domain records to protobuf messages and back."""

from __future__ import annotations

from datetime import datetime

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from leasehold._server.jobs.records import Job, JobEvent, JobStatus, JsonObject
from leasehold.v1 import jobs_pb2

STATUS_TO_PROTO = {
    JobStatus.QUEUED: jobs_pb2.JOB_STATUS_QUEUED,
    JobStatus.RUNNING: jobs_pb2.JOB_STATUS_RUNNING,
    JobStatus.SUCCEEDED: jobs_pb2.JOB_STATUS_SUCCEEDED,
    JobStatus.FAILED: jobs_pb2.JOB_STATUS_FAILED,
    JobStatus.CANCELLED: jobs_pb2.JOB_STATUS_CANCELLED,
}
STATUS_FROM_PROTO = {proto: status for status, proto in STATUS_TO_PROTO.items()}


def _timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def job_to_proto(job: Job) -> jobs_pb2.Job:
    return jobs_pb2.Job(
        id=job.id,
        kind=job.kind,
        resource_type=job.resource_type,
        resource_id=job.resource_id,
        status=STATUS_TO_PROTO[job.status],
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        timeout_seconds=job.timeout_seconds,
        available_at=_timestamp(job.available_at),
        cancel_requested_at=_timestamp(job.cancel_requested_at),
        retry_of_job_id=job.retry_of_job_id or "",
        error_message=job.error_message or "",
        error_type=job.error_type or "",
        created_at=_timestamp(job.created_at),
        updated_at=_timestamp(job.updated_at),
        started_at=_timestamp(job.started_at),
        completed_at=_timestamp(job.completed_at),
    )


def event_to_proto(event: JobEvent) -> jobs_pb2.JobEvent:
    return jobs_pb2.JobEvent(
        job_id=event.job_id,
        sequence=event.sequence,
        type=event.type,
        payload=dict_to_struct(event.payload),
        created_at=_timestamp(event.created_at),
    )


def dict_to_struct(value: JsonObject) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct


def struct_to_dict(struct: struct_pb2.Struct) -> JsonObject:
    return json_format.MessageToDict(struct)  # type: ignore[no-any-return]

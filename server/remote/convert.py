"""WorkerService messages as the records the executor runs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from leasehold._server.api.convert import STATUS_FROM_PROTO, struct_to_dict
from leasehold._server.jobs.records import ClaimedJob, Job, JobStatus, Lease
from leasehold.v1 import jobs_pb2, worker_pb2


def claimed_from_proto(message: worker_pb2.ClaimedJob) -> ClaimedJob:
    job = replace(job_from_proto(message.job, message.owner_id), traceparent=message.traceparent or None)
    return ClaimedJob(
        job=job,
        payload=struct_to_dict(message.payload),
        lease=Lease(job_id=job.id, token=message.lease_token, attempt=job.attempt),
        lease_expires_at=message.lease_expires_at.ToDatetime(tzinfo=UTC),
        checkpoint=struct_to_dict(message.checkpoint) if message.HasField("checkpoint") else None,
    )


def job_from_proto(message: jobs_pb2.Job, owner_id: str) -> Job:
    """`owner_id` comes from the claim: a Job message never names its owner."""
    return Job(
        id=message.id,
        owner_id=owner_id,
        kind=message.kind,
        resource_type=message.resource_type,
        resource_id=message.resource_id,
        status=STATUS_FROM_PROTO.get(message.status, JobStatus.RUNNING),
        attempt=message.attempt,
        max_attempts=message.max_attempts,
        timeout_seconds=message.timeout_seconds,
        available_at=_time(message, "available_at") or _EPOCH,
        cancel_requested_at=_time(message, "cancel_requested_at"),
        retry_of_job_id=message.retry_of_job_id or None,
        error_message=message.error_message or None,
        created_at=_time(message, "created_at") or _EPOCH,
        updated_at=_time(message, "updated_at") or _EPOCH,
        started_at=_time(message, "started_at"),
        completed_at=_time(message, "completed_at"),
        error_type=message.error_type or None,
        result=struct_to_dict(message.result) if message.HasField("result") else None,
    )


def _time(message: jobs_pb2.Job, name: str) -> datetime | None:
    if not message.HasField(name):  # type: ignore[arg-type]
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=UTC)


# A required time the message lacked (a server bug): a value, not a crash.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

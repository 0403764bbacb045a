"""WorkerService messages as the records the executor runs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from google.protobuf import struct_pb2, timestamp_pb2

from leasehold._server.api.convert import PARENT_FAILURE_TO_PROTO, STATUS_FROM_PROTO, struct_to_dict
from leasehold._server.jobs.records import ClaimedJob, Job, JobStatus, Lease, ParentFailurePolicy
from leasehold.v1 import jobs_pb2, worker_pb2


def claimed_from_proto(message: worker_pb2.ClaimedJob) -> ClaimedJob:
    job = replace(job_from_proto(message.job, message.owner_id), traceparent=message.traceparent or None)
    return ClaimedJob(
        job=job,
        payload=struct_to_dict(message.payload),
        lease=Lease(job_id=job.id, token=message.lease_token, attempt=job.attempt),
        lease_expires_at=message.lease_expires_at.ToDatetime(tzinfo=UTC),
        checkpoint=struct_to_dict(message.checkpoint) if message.HasField("checkpoint") else None,
        parent_results={
            parent_id: struct_to_dict(result, f"parent_results[{parent_id}]")
            for parent_id, result in _in_parent_order(message)
        },
    )


def _in_parent_order(message: worker_pb2.ClaimedJob) -> list[tuple[str, struct_pb2.Struct]]:
    """A proto map keeps no order: the handler gets its parents' results in
    the order the job names its parents, as an in-process handler does."""
    results = message.parent_results
    named = [parent_id for parent_id in message.job.depends_on if parent_id in results]
    others = sorted(set(results) - set(named))
    return [(parent_id, results[parent_id]) for parent_id in (*named, *others)]


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
        depends_on=tuple(message.depends_on),
        pending_dependencies=message.pending_dependencies,
        on_parent_failure=_POLICY_FROM_PROTO.get(message.on_parent_failure),
    )


def _time(message: jobs_pb2.Job, name: str) -> datetime | None:
    if not message.HasField(name):  # type: ignore[arg-type]
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=UTC)


# Unset (a job without parents) is None, as the server's own record has it.
_POLICY_FROM_PROTO: dict[int, ParentFailurePolicy] = {
    proto: policy for policy, proto in PARENT_FAILURE_TO_PROTO.items()
}

# A required time the message lacked (a server bug): a value, not a crash.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

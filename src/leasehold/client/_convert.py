"""Python values to the proto fields the requests take."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from google.protobuf import struct_pb2, timestamp_pb2

from leasehold.v1 import jobs_pb2

ParentFailure = Literal["cancel", "run"]
PARENT_FAILURE_POLICIES: dict[str, jobs_pb2.ParentFailurePolicy] = {
    "cancel": jobs_pb2.PARENT_FAILURE_POLICY_CANCEL,
    "run": jobs_pb2.PARENT_FAILURE_POLICY_RUN,
}


def enqueue_request(
    kind: str,
    payload: Mapping[str, Any] | None = None,
    *,
    resource_type: str = "",
    resource_id: str = "",
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = 0,
    timeout_seconds: int = 0,
    retry_policy: jobs_pb2.RetryPolicy | None = None,
    depends_on: Sequence[str] = (),
    on_parent_failure: ParentFailure | None = None,
    ref: str = "",
    depends_on_refs: Sequence[str] = (),
) -> jobs_pb2.EnqueueRequest:
    """One Enqueue, as `Client.enqueue` takes it, to send alone or as an item
    of `Client.batch_enqueue`. Inside a batch, `ref` names the item and
    `depends_on_refs` names the items it waits for, so a whole graph is
    submitted in one call before any of its ids exist:

        batch = [
            enqueue_request("docs.fetch", {"url": url}, ref="fetch"),
            enqueue_request("docs.index", depends_on_refs=["fetch"], ref="index"),
        ]

    `on_parent_failure`: "cancel" (the service's default) or "run"."""
    return jobs_pb2.EnqueueRequest(
        kind=kind,
        payload=struct(payload),
        resource_type=resource_type,
        resource_id=resource_id,
        run_at=timestamp(run_at),
        priority=priority,
        max_attempts=max_attempts,
        timeout_seconds=timeout_seconds,
        retry_policy=retry_policy,
        depends_on=list(depends_on),
        on_parent_failure=parent_failure(on_parent_failure),
        ref=ref,
        depends_on_refs=list(depends_on_refs),
    )


def parent_failure(policy: ParentFailure | None) -> jobs_pb2.ParentFailurePolicy:
    """None leaves the service's default (cancel); a mistyped name is refused
    here rather than sent as a policy nobody meant."""
    if policy is None:
        return jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED
    if policy not in PARENT_FAILURE_POLICIES:
        raise ValueError(f"on_parent_failure must be 'cancel' or 'run', not {policy!r}")
    return PARENT_FAILURE_POLICIES[policy]


def struct(payload: Mapping[str, Any] | None) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(dict(payload or {}))
    return value


def timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A Timestamp; a naive datetime is refused, since guessing its zone would
    silently move a job's run time by hours."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        raise ValueError("run_at must be timezone-aware (e.g. datetime.now(UTC))")
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value

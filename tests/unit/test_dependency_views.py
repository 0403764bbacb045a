"""How a job's place in a graph is shown and carried: the Job message's
fields, a remote worker's claim, List's page tokens and the client's request
builder, each without a server."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from leasehold._server.api.convert import WAIT_REASON_TO_PROTO, dict_to_struct, job_to_proto, timestamp
from leasehold._server.api.page_token import PageTokenCodec
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import (
    Job,
    JobFilter,
    JobStatus,
    PageCursor,
    ParentFailurePolicy,
    WaitReason,
)
from leasehold._server.jobs.state_machine import AWAITING_PARENTS
from leasehold._server.remote.convert import claimed_from_proto, job_from_proto
from leasehold.client import enqueue_request
from leasehold.v1 import jobs_pb2, worker_pb2

NOW = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
# What the store keeps as a waiting job's available_at: later than any due time.
FAR_FUTURE = AWAITING_PARENTS


def job(**fields: object) -> Job:
    values: dict[str, object] = {
        "id": "job_child",
        "owner_id": "alice",
        "kind": "example.echo",
        "resource_type": "",
        "resource_id": "",
        "status": JobStatus.QUEUED,
        "attempt": 0,
        "max_attempts": 3,
        "timeout_seconds": 900,
        "available_at": NOW,
        "cancel_requested_at": None,
        "retry_of_job_id": None,
        "error_message": None,
        "created_at": NOW,
        "updated_at": NOW,
        "started_at": None,
        "completed_at": None,
        **fields,
    }
    return Job(**values)  # type: ignore[arg-type]


def test_a_waiting_job_shows_its_parents_and_no_due_time() -> None:
    waiting = job(
        depends_on=("job_b", "job_a"),
        pending_dependencies=1,
        on_parent_failure=ParentFailurePolicy.RUN,
        available_at=FAR_FUTURE,
    )

    message = job_to_proto(waiting, WaitReason.DEPENDENCIES)

    assert list(message.depends_on) == ["job_b", "job_a"]
    assert message.pending_dependencies == 1
    assert message.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_RUN
    assert message.wait_reason == jobs_pb2.WAIT_REASON_DEPENDENCIES
    assert not message.HasField("available_at")


def test_a_child_a_parents_failure_ended_while_it_waited_has_no_due_time() -> None:
    ended = job(
        status=JobStatus.CANCELLED,
        depends_on=("job_a",),
        pending_dependencies=0,
        on_parent_failure=ParentFailurePolicy.CANCEL,
        available_at=FAR_FUTURE,
        error_type="DependencyFailed",
    )

    assert not job_to_proto(ended).HasField("available_at")


def test_a_released_job_has_its_due_time_again() -> None:
    released = job(
        depends_on=("job_a",), pending_dependencies=0, on_parent_failure=ParentFailurePolicy.CANCEL
    )

    message = job_to_proto(released)

    assert message.available_at == timestamp(NOW)
    assert message.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_CANCEL


def test_a_job_without_parents_leaves_the_policy_unset() -> None:
    message = job_to_proto(job())

    assert list(message.depends_on) == [] and message.pending_dependencies == 0
    assert message.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED


def test_every_wait_reason_has_its_proto_value() -> None:
    assert WAIT_REASON_TO_PROTO[WaitReason.DEPENDENCIES] == jobs_pb2.WAIT_REASON_DEPENDENCIES
    assert len(set(WAIT_REASON_TO_PROTO.values())) == len(WaitReason)


@pytest.mark.parametrize("policy", [None, ParentFailurePolicy.CANCEL, ParentFailurePolicy.RUN])
def test_a_remote_worker_reads_back_the_jobs_place_in_its_graph(policy: ParentFailurePolicy | None) -> None:
    original = job(
        depends_on=("job_a", "job_b") if policy else (),
        pending_dependencies=0,
        on_parent_failure=policy,
    )

    read = job_from_proto(job_to_proto(original), "alice")

    assert (read.depends_on, read.pending_dependencies, read.on_parent_failure) == (
        original.depends_on,
        0,
        policy,
    )


def test_a_remote_claim_hands_parent_results_in_the_jobs_order_of_parents() -> None:
    parents = ["job_z", "job_a", "job_m"]
    message = worker_pb2.ClaimedJob(
        job=job_to_proto(replace(job(status=JobStatus.RUNNING, attempt=1), depends_on=tuple(parents))),
        payload=dict_to_struct({}),
        owner_id="alice",
        lease_token="t",
        lease_expires_at=timestamp(NOW),
        parent_results={
            "job_m": dict_to_struct({"n": 3}),
            "job_z": dict_to_struct({"n": 1, "items": [1, 2.5]}),
        },
    )

    claimed = claimed_from_proto(message)

    # job_a produced no result (or did not fit): absent, not empty.
    assert list(claimed.parent_results) == ["job_z", "job_m"]
    # Integral numbers as int, as a payload's are.
    assert claimed.parent_results == {"job_z": {"n": 1, "items": [1, 2.5]}, "job_m": {"n": 3}}
    assert isinstance(claimed.parent_results["job_z"]["n"], int)


def test_a_claim_without_parents_has_no_parent_results() -> None:
    message = worker_pb2.ClaimedJob(
        job=job_to_proto(job(status=JobStatus.RUNNING, attempt=1)),
        owner_id="alice",
        lease_token="t",
        lease_expires_at=timestamp(NOW),
    )

    assert claimed_from_proto(message).parent_results == {}


# ----- List's page tokens -------------------------------------------------------------------


def test_a_page_token_is_bound_to_the_children_filter() -> None:
    codec = PageTokenCodec(b"k" * 32)
    children = JobFilter(depends_on="job_parent")
    token = codec.encode("alice", children, PageCursor("job_9"))

    assert codec.decode("alice", children, token) == PageCursor("job_9")
    for other in (JobFilter(), JobFilter(depends_on="job_other")):
        with pytest.raises(InvalidArgument) as refused:
            codec.decode("alice", other, token)
        assert refused.value.field == "page_token"


def test_a_token_issued_before_the_children_filter_existed_still_reads() -> None:
    """The digest of a filter without a parent is what it always was, so a
    token a caller holds across an upgrade goes on working."""
    codec = PageTokenCodec(b"k" * 32)
    old_digest = hashlib.sha256(json.dumps([["queued"], "example.echo", "", ""]).encode()).hexdigest()[:16]
    token = codec.encode_position("alice", old_digest, "job_9")

    cursor = codec.decode(
        "alice", JobFilter(statuses=frozenset({JobStatus.QUEUED}), kind="example.echo"), token
    )

    assert cursor == PageCursor("job_9")


# ----- the client's request builder --------------------------------------------------------------


def test_enqueue_request_carries_a_graphs_fields() -> None:
    request = enqueue_request(
        "docs.merge",
        {"n": 1},
        depends_on=["job_a"],
        on_parent_failure="run",
        ref="merge",
        depends_on_refs=["fetch", "load"],
    )

    assert list(request.depends_on) == ["job_a"]
    assert request.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_RUN
    assert (request.ref, list(request.depends_on_refs)) == ("merge", ["fetch", "load"])
    assert enqueue_request("x").on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED
    assert enqueue_request("x", on_parent_failure="cancel").on_parent_failure == (
        jobs_pb2.PARENT_FAILURE_POLICY_CANCEL
    )


@pytest.mark.parametrize("policy", ["RUN", "skip", ""])
def test_enqueue_request_refuses_an_unknown_policy(policy: str) -> None:
    with pytest.raises(ValueError, match="'cancel' or 'run'"):
        enqueue_request("x", on_parent_failure=policy)  # type: ignore[arg-type]

"""The state machine as data: its transitions are well formed, and applying one
in Python does what the table says (the SQL engines compile the same table; the
repository contract suite holds every engine to the same outcomes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.records import JobStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def running_job(**changes: Any) -> dict[str, Any]:
    job = {
        "id": "job_1",
        "status": "running",
        "attempt": 1,
        "max_attempts": 3,
        "timeout_seconds": 900,
        "available_at": NOW - timedelta(seconds=5),
        "started_at": NOW - timedelta(seconds=5),
        "completed_at": None,
        "cancel_requested_at": None,
        "deadline_at": None,
        "error_message": None,
        "error_type": None,
        "lease_owner": "w1",
        "lease_token": "t1",
        "lease_expires_at": NOW + timedelta(seconds=30),
        "updated_at": NOW - timedelta(seconds=5),
        "last_event_sequence": 2,
        **sm.policy_columns(None),
    }
    return {**job, **changes}


def test_every_transition_has_an_unconditional_last_branch_and_one_status_per_branch() -> None:
    for transition in sm.TRANSITIONS:
        assert not transition.branches[-1].when, transition.name
        statuses = [branch.status for branch in transition.branches]
        assert len(set(statuses)) == len(statuses), transition.name


def test_a_malformed_transition_is_refused_when_it_is_defined() -> None:
    with pytest.raises(ValueError, match="unconditionally"):
        sm.Transition(
            "bad", sm.RUNNING, sm.Find.LEASE, (sm.Branch(sm.FAILED, when=((sm.Guard.RETRYABLE, True),)),)
        )
    with pytest.raises(ValueError, match="its own status"):
        sm.Transition("bad", sm.RUNNING, sm.Find.LEASE, (sm.Branch(sm.FAILED), sm.Branch(sm.FAILED)))


@pytest.mark.parametrize(
    ("job", "retryable", "status", "events"),
    [
        (running_job(), True, JobStatus.QUEUED, ["job.retry_scheduled"]),
        (running_job(), False, JobStatus.FAILED, ["job.failed"]),
        (running_job(attempt=3), True, JobStatus.FAILED, ["job.failed"]),
        (running_job(cancel_requested_at=NOW), True, JobStatus.FAILED, ["job.failed"]),
    ],
)
def test_a_failure_is_retried_only_while_attempts_remain_it_is_retryable_and_no_cancel_waits(
    job: dict[str, Any], retryable: bool, status: JobStatus, events: list[str]
) -> None:
    retry_at = NOW + timedelta(seconds=2)
    inputs = sm.Inputs(now=NOW, retryable=retryable, error="boom", error_type="KeyError", retry_at=retry_at)

    after, branch = sm.FAIL.apply(job, inputs)

    assert after["status"] == status.value
    assert [event_type for _, event_type, _ in sm.lifecycle_events(branch, after)] == events
    assert (after["error_message"], after["error_type"]) == ("boom", "KeyError")
    assert after["lease_token"] is None and after["last_event_sequence"] == 3
    if status is JobStatus.QUEUED:
        assert after["available_at"] == retry_at and after["completed_at"] is None
    else:
        assert after["completed_at"] == NOW


def test_lifecycle_events_take_the_sequences_the_transition_reserved_and_name_the_attempt() -> None:
    expired = running_job(attempt=3, lease_expires_at=NOW - timedelta(seconds=1))

    after, branch = sm.RECOVER_EXPIRED_LEASE.apply(expired, sm.Inputs(now=NOW))

    assert after["status"] == "failed" and after["error_type"] == sm.LEASE_EXPIRED_ERROR_TYPE
    assert sm.lifecycle_events(branch, after) == [
        (3, "job.lease_expired", {"attempt": 3}),
        (4, "job.failed", {"error": sm.LEASE_EXPIRED_ERROR_TEXT, "error_type": sm.LEASE_EXPIRED_ERROR_TYPE}),
    ]


def test_a_release_gives_the_attempt_back_and_its_event_names_the_interrupted_one() -> None:
    after, branch = sm.RELEASE.apply(running_job(attempt=2), sm.Inputs(now=NOW))

    assert (after["status"], after["attempt"], after["available_at"]) == ("queued", 1, NOW)
    assert sm.lifecycle_events(branch, after) == [(3, "job.released", {"attempt": 2})]


def test_a_claim_takes_the_lease_and_keeps_the_first_start_time() -> None:
    queued = running_job(status="queued", lease_owner=None, lease_token=None, lease_expires_at=None)
    expires = NOW + timedelta(seconds=30)

    after, branch = sm.CLAIM.apply(queued, sm.Inputs(now=NOW, worker="w2", token="t2", expires_at=expires))

    assert (after["status"], after["attempt"], after["lease_token"], after["lease_expires_at"]) == (
        "running",
        2,
        "t2",
        expires,
    )
    assert after["started_at"] == queued["started_at"]
    assert sm.lifecycle_events(branch, after) == [(3, "job.started", {"attempt": 2})]


def test_a_heartbeat_only_moves_the_lease() -> None:
    job = running_job()
    expires = NOW + timedelta(seconds=60)

    after, branch = sm.HEARTBEAT.apply(job, sm.Inputs(now=NOW, expires_at=expires))

    assert {key for key in after if after[key] != job[key]} == {"lease_expires_at"}
    assert sm.lifecycle_events(branch, after) == []


@pytest.mark.parametrize(
    ("status", "requested", "expected"),
    [
        (JobStatus.QUEUED, False, sm.CANCEL_QUEUED),
        (JobStatus.RUNNING, False, sm.REQUEST_CANCEL),
        (JobStatus.RUNNING, True, None),
        (JobStatus.SUCCEEDED, False, None),
        (JobStatus.FAILED, False, None),
        (JobStatus.CANCELLED, False, None),
    ],
)
def test_an_owners_cancel_acts_once_and_never_on_a_finished_job(
    status: JobStatus, requested: bool, expected: sm.Transition | None
) -> None:
    assert sm.owner_cancel(status, requested) is expected


def test_the_cancellable_statuses_are_those_a_cancel_acts_on() -> None:
    """A bulk cancel selects its jobs by the set, one by one they are cancelled by the rule."""
    assert sm.CANCELLABLE_STATUSES == {s for s in JobStatus if sm.owner_cancel(s, False) is not None}

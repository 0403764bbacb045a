"""The job page's buttons follow the domain's own rule: Cancel while queued,
or running with no cancel asked yet; Retry once failed or cancelled."""

from __future__ import annotations

import pytest

from leasehold._server.dashboard.actions import JobActions, job_actions
from leasehold.v1 import jobs_pb2


def job(status: jobs_pb2.JobStatus.ValueType, cancel_requested: bool = False) -> jobs_pb2.Job:
    made = jobs_pb2.Job(id="j1", status=status)
    if cancel_requested:
        made.cancel_requested_at.seconds = 1
    return made


@pytest.mark.parametrize(
    ("status", "cancel", "retry"),
    [
        (jobs_pb2.JOB_STATUS_QUEUED, True, False),
        (jobs_pb2.JOB_STATUS_RUNNING, True, False),
        (jobs_pb2.JOB_STATUS_SUCCEEDED, False, False),
        (jobs_pb2.JOB_STATUS_FAILED, False, True),
        (jobs_pb2.JOB_STATUS_CANCELLED, False, True),
        (jobs_pb2.JOB_STATUS_UNSPECIFIED, False, False),
    ],
)
def test_each_status_offers_only_what_it_allows(
    status: jobs_pb2.JobStatus.ValueType, cancel: bool, retry: bool
) -> None:
    assert job_actions(job(status)) == JobActions(cancel=cancel, retry=retry)


def test_a_running_job_already_asked_to_cancel_offers_nothing() -> None:
    assert job_actions(job(jobs_pb2.JOB_STATUS_RUNNING, cancel_requested=True)).names() == []


def test_names_are_what_the_live_page_keeps() -> None:
    assert job_actions(job(jobs_pb2.JOB_STATUS_QUEUED)).names() == ["cancel"]
    assert job_actions(job(jobs_pb2.JOB_STATUS_FAILED)).names() == ["retry"]

"""An owner's overview figures come from GetStats whole (every job, every
status, per kind); only the oldest queued job is picked from a List page, by
the soonest due time rather than the page's newest-first order."""

from __future__ import annotations

from leasehold._server.dashboard.stats import owner_summary
from leasehold.v1 import jobs_pb2


def _queued(job_id: str, due_seconds: int) -> jobs_pb2.Job:
    job = jobs_pb2.Job(id=job_id, kind="k", status=jobs_pb2.JOB_STATUS_QUEUED)
    job.available_at.FromSeconds(due_seconds)
    return job


def _stats() -> jobs_pb2.GetStatsResponse:
    stats = jobs_pb2.GetStatsResponse(
        total=jobs_pb2.JobCounts(queued=700, running=3, succeeded=1_200, failed=4),
        kinds=[
            jobs_pb2.KindJobCounts(kind="a", counts=jobs_pb2.JobCounts(queued=700, succeeded=1_000)),
            jobs_pb2.KindJobCounts(kind="b", counts=jobs_pb2.JobCounts(running=3, succeeded=200, failed=4)),
        ],
        kinds_truncated=True,
    )
    stats.computed_at.FromSeconds(1_800_000_000)
    return stats


def test_the_counts_are_get_stats_own_however_few_jobs_were_listed() -> None:
    summary = owner_summary(_stats(), [_queued("j1", 100)])
    assert summary.by_status == {"queued": 700, "running": 3, "succeeded": 1_200, "failed": 4, "cancelled": 0}
    assert summary.by_kind == {
        "a": {"queued": 700, "running": 0, "succeeded": 1_000, "failed": 0, "cancelled": 0},
        "b": {"queued": 0, "running": 3, "succeeded": 200, "failed": 4, "cancelled": 0},
    }
    assert summary.kinds_truncated
    assert summary.computed_at.seconds == 1_800_000_000
    assert summary.queued_looked_at == 1


def test_the_oldest_queued_job_is_the_one_due_soonest_on_the_page() -> None:
    page = [_queued("newest", 300), _queued("due-first", 100), _queued("oldest-created", 200)]
    summary = owner_summary(_stats(), page)
    assert summary.oldest_queued is not None and summary.oldest_queued.id == "due-first"
    assert summary.queued_looked_at == 3


def test_nothing_queued_means_no_oldest_job() -> None:
    assert owner_summary(jobs_pb2.GetStatsResponse(), []).oldest_queued is None


def test_a_job_waiting_for_its_parents_is_not_the_oldest_queued() -> None:
    """Its available_at is unset (it is due at no time yet), which would read
    as 1970 and win every time."""
    waiting = jobs_pb2.Job(id="waiting", kind="k", status=jobs_pb2.JOB_STATUS_QUEUED, pending_dependencies=1)
    summary = owner_summary(_stats(), [_queued("due", 100), waiting])
    assert summary.oldest_queued is not None and summary.oldest_queued.id == "due"

"""The job page's graph: what a queued job is waiting for in words (its
parents counted), its parents in the order it gave them with their statuses
(one the API no longer has says so instead of failing the page), its newest
children, and never more than a few parent reads in flight at once."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from leasehold._server.dashboard.graph import (
    CHILDREN_SHOWN,
    PARENT_READS_AT_ONCE,
    Relative,
    parent_rule,
    relatives,
    waiting_for,
)
from leasehold.v1 import jobs_pb2


def _queued(**fields: Any) -> jobs_pb2.Job:
    return jobs_pb2.Job(id="child", status=jobs_pb2.JOB_STATUS_QUEUED, **fields)


@pytest.mark.parametrize(("pending", "said"), [(1, "waiting for 1 parent"), (3, "waiting for 3 parents")])
def test_a_job_waiting_for_its_parents_counts_them(pending: int, said: str) -> None:
    job = _queued(
        depends_on=["a", "b", "c"],
        pending_dependencies=pending,
        wait_reason=jobs_pb2.WAIT_REASON_DEPENDENCIES,
    )
    assert waiting_for(job) == said


def test_other_wait_reasons_in_words_and_nothing_for_a_job_not_queued() -> None:
    assert (
        waiting_for(_queued(wait_reason=jobs_pb2.WAIT_REASON_PAUSED)) == "waiting for its kind to be resumed"
    )
    assert waiting_for(_queued(wait_reason=jobs_pb2.WAIT_REASON_READY)) == "waiting for a free slot"
    assert waiting_for(_queued()) == ""
    running = jobs_pb2.Job(id="j", status=jobs_pb2.JOB_STATUS_RUNNING, depends_on=["a"])
    assert waiting_for(running) == ""


def test_the_rule_follows_on_parent_failure() -> None:
    assert "whatever the outcome" in parent_rule(
        jobs_pb2.Job(on_parent_failure=jobs_pb2.PARENT_FAILURE_POLICY_RUN)
    )
    for policy in (jobs_pb2.PARENT_FAILURE_POLICY_CANCEL, jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED):
        assert "cancels it" in parent_rule(jobs_pb2.Job(on_parent_failure=policy))


class _Api:
    """Get and List as the API answers them, counting the Gets in flight."""

    def __init__(
        self, jobs: dict[str, jobs_pb2.Job], children: list[jobs_pb2.Job], more: bool = False
    ) -> None:
        self.jobs = jobs
        self.children = children
        self.more = more
        self.in_flight = 0
        self.most_in_flight = 0
        self.listed: list[tuple[str, int]] = []

    async def get(self, job_id: str) -> jobs_pb2.Job:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            if job_id not in self.jobs:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    details=f"job {job_id} not found or not accessible",
                )
            return self.jobs[job_id]
        finally:
            self.in_flight -= 1

    async def list_page(self, *, depends_on: str = "", page_size: int = 0) -> jobs_pb2.ListResponse:
        self.listed.append((depends_on, page_size))
        return jobs_pb2.ListResponse(jobs=self.children, next_page_token="more" if self.more else "")


async def test_parents_in_their_order_with_statuses_and_a_gone_one_said_so() -> None:
    parents = {
        "p1": jobs_pb2.Job(id="p1", status=jobs_pb2.JOB_STATUS_SUCCEEDED),
        "p3": jobs_pb2.Job(id="p3", status=jobs_pb2.JOB_STATUS_RUNNING),
    }
    children = [jobs_pb2.Job(id="c1", status=jobs_pb2.JOB_STATUS_QUEUED)]
    api = _Api(parents, children)
    job = _queued(depends_on=["p3", "p2", "p1"], pending_dependencies=1)
    found = await relatives(api, job)
    assert found.parents == [Relative("p3", "running"), Relative("p2", None), Relative("p1", "succeeded")]
    assert found.children == [Relative("c1", "queued")]
    assert not found.more_children
    assert api.listed == [("child", CHILDREN_SHOWN)]


async def test_a_hundred_parents_are_read_a_few_at_a_time() -> None:
    ids = [f"p{n}" for n in range(100)]
    api = _Api({i: jobs_pb2.Job(id=i, status=jobs_pb2.JOB_STATUS_SUCCEEDED) for i in ids}, [], more=True)
    found = await relatives(api, _queued(depends_on=ids))
    assert [parent.id for parent in found.parents] == ids
    assert 1 < api.most_in_flight <= PARENT_READS_AT_ONCE
    assert found.more_children


async def test_an_api_failure_other_than_not_found_is_the_pages_error() -> None:
    class Unavailable(_Api):
        async def get(self, job_id: str) -> jobs_pb2.Job:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())

    with pytest.raises(grpc.aio.AioRpcError):
        await relatives(Unavailable({}, []), _queued(depends_on=["p1"]))

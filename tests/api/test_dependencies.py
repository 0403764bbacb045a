"""Graphs of jobs through the real server on each database (DESIGN §18): a
diamond submitted as one BatchEnqueue runs in order and its last step sees its
parents' results; a waiting job is QUEUED with WAIT_REASON_DEPENDENCIES and no
available_at; List's children filter and its page tokens; a remote worker's
claim carries the parents' results; request ids and resource keys keep
working for children."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from leasehold.client import to_dict
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from leasehold.worker import HandlerRegistry, JobContext
from tests.api.helpers import (
    CANCELLED,
    FAILED,
    QUEUED,
    SUCCEEDED,
    WAIT,
    collect_events,
    enqueue,
    error_reason,
    expect_error,
    expect_invalid,
    get_job,
    list_all,
    list_jobs,
    struct,
    wait_for_terminal,
)
from tests.support import OTHER_OWNER, OWNER, Gate, owner_metadata, test_registry

Stub = jobs_pb2_grpc.JobServiceStub
TOKEN = secrets.token_urlsafe(24)
WORKER_AUTH = (("authorization", f"Bearer {TOKEN}"),)
REMOTE_KIND = "remote.merge"


@dataclass
class Steps:
    """What each `test.step` attempt saw, in the order the attempts began."""

    started: list[str] = field(default_factory=list)
    parent_results: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def handler(self, ctx: JobContext) -> dict[str, Any]:
        """`{"name": n}` -> the result `{"name": n, "parents": <how many results it was handed>}`."""
        self.started.append(ctx.payload["name"])
        self.parent_results[ctx.payload["name"]] = dict(ctx.parent_results)
        return {"name": ctx.payload["name"], "parents": len(ctx.parent_results)}


@pytest.fixture
def steps() -> Steps:
    return Steps()


@pytest.fixture
def registry(gate: Gate, steps: Steps) -> HandlerRegistry:
    kinds = test_registry(gate)
    kinds.register("test.step", steps.handler)
    kinds.register("test.big", big_result)
    return kinds


async def big_result(ctx: Any) -> dict[str, Any]:
    """Nearly the largest result a job may keep (256 KiB)."""
    return {"blob": "x" * BIG_RESULT}


BIG_RESULT = 250_000


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {"remote_kinds": ("remote.*",), "worker_token": TOKEN}


def later() -> timestamp_pb2.Timestamp:
    """A run_at an hour ahead: a parent that stays queued while the test looks."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    return stamp


def step(name: str, **fields: Any) -> jobs_pb2.EnqueueRequest:
    return jobs_pb2.EnqueueRequest(kind="test.step", payload=struct({"name": name}), **fields)


async def batch(
    stub: Stub, items: list[jobs_pb2.EnqueueRequest], *, request_id: str = "", owner: str = OWNER
) -> list[jobs_pb2.EnqueueResponse]:
    request = jobs_pb2.BatchEnqueueRequest(requests=items, request_id=request_id)
    return list((await stub.BatchEnqueue(request, metadata=owner_metadata(owner))).responses)


async def waiting_parent(stub: Stub, owner: str = OWNER) -> str:
    """A job that stays queued (due in an hour) for children to wait on."""
    return (await enqueue(stub, "test.step", {"name": "parent"}, run_at=later(), owner=owner)).job.id


# ----- a diamond --------------------------------------------------------------------------------


async def test_a_diamond_in_one_batch_runs_in_order_and_the_last_step_sees_both_results(stub, app, steps):
    responses = await batch(
        stub,
        [
            # The last step first: refs may name later items of the batch.
            step("d", depends_on_refs=["b", "c"]),
            step("b", ref="b", depends_on_refs=["a"]),
            step("a", ref="a"),
            step("c", ref="c", depends_on_refs=["a"]),
        ],
    )
    d, b, a, c = (response.job for response in responses)

    assert all(response.created for response in responses)
    assert (list(a.depends_on), list(b.depends_on), list(c.depends_on)) == ([], [a.id], [a.id])
    assert list(d.depends_on) == [b.id, c.id]
    assert [job.pending_dependencies for job in (a, b, c, d)] == [0, 1, 1, 2]
    assert a.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED
    assert d.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_CANCEL
    assert a.HasField("available_at")
    assert not any(job.HasField("available_at") for job in (b, c, d))

    done = await wait_for_terminal(stub, d.id)

    assert done.status == SUCCEEDED and done.pending_dependencies == 0
    assert steps.started[0] == "a" and sorted(steps.started[1:3]) == ["b", "c"] and steps.started[3] == "d"
    assert steps.parent_results["d"] == {b.id: {"name": "b", "parents": 1}, c.id: {"name": "c", "parents": 1}}
    assert list(steps.parent_results["d"]) == [b.id, c.id]  # in depends_on order
    assert steps.parent_results["b"] == {a.id: {"name": "a", "parents": 0}}
    assert steps.parent_results["a"] == {}
    types = [event.type for event in await collect_events(stub, d.id)]
    assert types == ["job.queued", "job.dependencies_met", "job.started", "job.succeeded"]
    # Each step began only after its parents had succeeded.
    for child, parents in ((b, [a]), (c, [a]), (d, [b, c])):
        started = await _event_time(stub, child.id, "job.started")
        for parent in parents:
            assert await _event_time(stub, parent.id, "job.succeeded") <= started


async def _event_time(stub: Stub, job_id: str, event_type: str) -> datetime:
    (event,) = [event for event in await collect_events(stub, job_id) if event.type == event_type]
    return event.created_at.ToDatetime(tzinfo=UTC)


# ----- a waiting job ------------------------------------------------------------------------------


async def test_a_waiting_job_is_queued_for_its_dependencies_with_no_due_time(stub, app):
    parent = await waiting_parent(stub)
    child = (await enqueue(stub, "test.step", {"name": "child"}, depends_on=[parent])).job

    got = await get_job(stub, child.id)

    assert got.status == QUEUED and got.wait_reason == jobs_pb2.WAIT_REASON_DEPENDENCIES
    assert (list(got.depends_on), got.pending_dependencies) == ([parent], 1)
    assert got.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_CANCEL
    assert not got.HasField("available_at")
    (listed,) = await list_all(stub, depends_on=parent)
    assert listed.id == child.id and not listed.HasField("available_at")
    assert (await get_job(stub, parent)).wait_reason == jobs_pb2.WAIT_REASON_SCHEDULED


async def test_a_cancelled_parent_cancels_its_waiting_child_naming_it(stub, app):
    parent = await waiting_parent(stub)
    child = (await enqueue(stub, "test.step", {"name": "child"}, depends_on=[parent])).job
    grandchild = (await enqueue(stub, "test.step", {"name": "grandchild"}, depends_on=[child.id])).job

    await stub.Cancel(jobs_pb2.CancelRequest(job_id=parent), metadata=owner_metadata())

    for job_id in (child.id, grandchild.id):
        ended = await wait_for_terminal(stub, job_id)
        assert ended.status == CANCELLED and ended.error_type == "DependencyFailed"
        assert not ended.HasField("available_at")
    assert parent in (await get_job(stub, child.id)).error_message
    events = await collect_events(stub, child.id)
    assert [event.type for event in events][-2:] == ["job.dependency_failed", "job.cancelled"]
    assert to_dict(events[-2].payload) == {"parent_job_id": parent}


async def test_under_the_run_policy_a_failed_parent_still_lets_the_child_run(stub, app, steps):
    parent = (await enqueue(stub, "example.fail", {"message": "boom"}, max_attempts=1)).job
    child = (
        await enqueue(
            stub,
            "test.step",
            {"name": "child"},
            depends_on=[parent.id],
            on_parent_failure=jobs_pb2.PARENT_FAILURE_POLICY_RUN,
        )
    ).job

    assert (await wait_for_terminal(stub, parent.id)).status == FAILED
    done = await wait_for_terminal(stub, child.id)

    assert done.status == SUCCEEDED and done.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_RUN
    assert steps.parent_results["child"] == {}  # a failed parent has no result to hand over


# ----- children ---------------------------------------------------------------------------------------


async def test_list_walks_a_jobs_children_and_its_token_is_bound_to_that_parent(stub, app):
    parent = await waiting_parent(stub)
    other = await waiting_parent(stub)
    children = [
        (await enqueue(stub, "test.step", {"name": f"c{i}"}, depends_on=[parent])).job.id for i in range(5)
    ]
    await enqueue(stub, "test.step", {"name": "elsewhere"}, depends_on=[other])

    walked = await list_all(stub, depends_on=parent, page_size=2)
    first = await list_jobs(stub, depends_on=parent, page_size=2)

    assert [job.id for job in walked] == children[::-1]  # newest first, as any List
    assert first.next_page_token
    for filters in ({}, {"depends_on": other}, {"depends_on": parent, "kind": "test.step"}):
        err = await expect_invalid(
            list_jobs(stub, page_token=first.next_page_token, page_size=2, **filters), "page_token"
        )
        assert "different filters" in err.details()
    # Another owner sees no children of a job that is not theirs, as of one nobody has.
    assert await list_all(stub, depends_on=parent, owner=OTHER_OWNER) == []
    assert await list_all(stub, depends_on="job_" + "0" * 32) == []


async def test_a_filter_id_with_nul_or_over_256_characters_is_refused(stub, app):
    await expect_invalid(list_jobs(stub, depends_on="job_\x00"), "depends_on")
    await expect_invalid(list_jobs(stub, depends_on="j" * 257), "depends_on")


# ----- idempotency ----------------------------------------------------------------------------------


async def test_a_request_id_covers_the_parents(stub, app):
    first, second = await waiting_parent(stub), await waiting_parent(stub)
    made = await enqueue(stub, "test.step", {"name": "c"}, depends_on=[first], request_id="child-1")

    again = await enqueue(stub, "test.step", {"name": "c"}, depends_on=[first], request_id="child-1")
    other = await expect_error(
        enqueue(stub, "test.step", {"name": "c"}, depends_on=[second], request_id="child-1"),
        grpc.StatusCode.FAILED_PRECONDITION,
    )

    assert again.job.id == made.job.id and again.created is True
    assert error_reason(other) == "REQUEST_ID_REUSED"
    assert [job.id for job in await list_all(stub, depends_on=second)] == []


async def test_a_repeated_graph_returns_the_first_graph(stub, app):
    parent = await waiting_parent(stub)
    items = [
        step("x", ref="x", depends_on=[parent]),
        step("y", depends_on_refs=["x"]),
    ]

    first = await batch(stub, items, request_id="graph-1")
    again = await batch(stub, items, request_id="graph-1")
    rewired = [step("x", ref="x", depends_on=[parent]), step("y")]
    err = await expect_error(batch(stub, rewired, request_id="graph-1"), grpc.StatusCode.FAILED_PRECONDITION)

    assert [r.job.id for r in again] == [r.job.id for r in first]
    assert list(again[1].job.depends_on) == [first[0].job.id]
    assert error_reason(err) == "REQUEST_ID_REUSED"
    assert len(await list_all(stub)) == 3


async def test_a_child_whose_resource_has_a_job_gets_that_job_with_its_parents_unchanged(stub, app):
    parent = await waiting_parent(stub)
    existing = (await enqueue(stub, "test.step", {"name": "doc"}, resource_type="doc", resource_id="7")).job

    again = await enqueue(
        stub, "test.step", {"name": "doc"}, resource_type="doc", resource_id="7", depends_on=[parent]
    )
    (in_batch,) = [
        r
        for r in await batch(
            stub,
            [step("p", ref="p"), step("doc", resource_type="doc", resource_id="7", depends_on_refs=["p"])],
        )
        if r.job.id == existing.id
    ]

    assert again.created is False and again.job.id == existing.id
    assert list(again.job.depends_on) == [] and again.job.pending_dependencies == 0
    assert in_batch.created is False and list(in_batch.job.depends_on) == []
    assert list((await get_job(stub, existing.id)).depends_on) == []
    assert await list_all(stub, depends_on=parent) == []


# ----- a remote worker's claim --------------------------------------------------------------------


async def test_a_remote_claim_carries_the_parents_results(stub, app, channel):
    first, second = (
        response.job for response in await batch(stub, [step("one", ref="one"), step("two", ref="two")])
    )
    child = (await enqueue(stub, REMOTE_KIND, {"n": 1}, depends_on=[second.id, first.id])).job
    for parent in (first, second):
        assert (await wait_for_terminal(stub, parent.id)).status == SUCCEEDED

    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    async with asyncio.timeout(WAIT):
        claimed = await worker.Claim(
            worker_pb2.ClaimRequest(worker_id="w-deps", kinds=[REMOTE_KIND], wait_seconds=5),
            metadata=WORKER_AUTH,
        )
    (job,) = claimed.jobs

    assert job.job.id == child.id and list(job.job.depends_on) == [second.id, first.id]
    assert {parent: to_dict(result) for parent, result in job.parent_results.items()} == {
        first.id: {"name": "one", "parents": 0},
        second.id: {"name": "two", "parents": 0},
    }


async def test_a_claim_answer_stays_within_what_a_worker_reads_by_default(stub, app, channel):
    """Twenty children of a parent with a 250 KB result would make a 5 MB
    answer, past gRPC's default 4 MiB: the answer carries what fits, the rest
    are claimable again at once with their attempts uncounted, and this
    channel (at gRPC's defaults) reads every answer."""
    parent = (await enqueue(stub, "test.big", {})).job
    assert (await wait_for_terminal(stub, parent.id)).status == SUCCEEDED
    children = await batch(
        stub, [jobs_pb2.EnqueueRequest(kind=REMOTE_KIND, depends_on=[parent.id]) for _ in range(20)]
    )
    wanted = {response.job.id for response in children}

    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    seen: list[worker_pb2.ClaimResponse] = []
    async with asyncio.timeout(WAIT):
        while sum(len(answer.jobs) for answer in seen) < len(wanted):
            seen.append(
                await worker.Claim(
                    worker_pb2.ClaimRequest(
                        worker_id="w-big", kinds=[REMOTE_KIND], max_jobs=20, wait_seconds=5
                    ),
                    metadata=WORKER_AUTH,
                )
            )
    assert len(seen) >= 2 and len(seen[0].jobs) < len(wanted)
    assert all(answer.ByteSize() <= 4 * 1024 * 1024 for answer in seen)
    claimed = [job for answer in seen for job in answer.jobs]
    assert sorted(job.job.id for job in claimed) == sorted(wanted)  # each exactly once
    assert {job.job.attempt for job in claimed} == {1}
    assert all(
        len(job.parent_results[parent.id].fields["blob"].string_value) == BIG_RESULT for job in claimed
    )

"""A job's result through the real server (DESIGN §10 Job results): the JSON
object an in-process handler returns is the succeeded job's `result`; Get shows
it, List never does; returning nothing sets none, and returning anything else
fails the attempt with a clear error."""

from __future__ import annotations

from typing import Any

import pytest

from leasehold.v1 import jobs_pb2
from leasehold.worker import HandlerRegistry, JobContext
from tests.api.helpers import enqueue, get_job, list_jobs, struct, wait_for_terminal
from tests.support import Gate, test_registry

FAILED = jobs_pb2.JOB_STATUS_FAILED
SUCCEEDED = jobs_pb2.JOB_STATUS_SUCCEEDED


async def summarise(ctx: JobContext) -> dict[str, Any]:
    return {"pages": ctx.payload["pages"], "words": [3, 5], "title": "report"}


async def returns(ctx: JobContext) -> Any:
    if ctx.payload.get("oversized"):  # built here: no payload could carry it in
        return {"big": "x" * (256 * 1024)}
    return ctx.payload["value"]


async def returns_nothing(ctx: JobContext) -> None:
    await ctx.append_event("done", {})


@pytest.fixture
def registry(gate: Gate) -> HandlerRegistry:
    kinds = test_registry(gate)
    kinds.register("test.summarise", summarise)
    kinds.register("test.returns", returns)
    kinds.register("test.nothing", returns_nothing)
    return kinds


async def test_the_object_a_handler_returns_is_the_result_get_shows_and_list_does_not(stub, app):
    job = (await enqueue(stub, "test.summarise", {"pages": 12})).job

    done = await wait_for_terminal(stub, job.id)
    fetched = await get_job(stub, job.id)
    listed = (await list_jobs(stub)).jobs

    assert done.status == SUCCEEDED
    assert fetched.result == struct({"pages": 12, "words": [3, 5], "title": "report"})
    assert [j.id for j in listed] == [job.id] and not listed[0].HasField("result")


async def test_a_handler_that_returns_nothing_leaves_no_result(stub, app):
    job = (await enqueue(stub, "test.nothing", {})).job

    await wait_for_terminal(stub, job.id)

    fetched = await get_job(stub, job.id)
    assert fetched.status == SUCCEEDED and not fetched.HasField("result")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([1, 2], "must be a JSON object or None, not list"),
        ("done", "must be a JSON object or None, not str"),
        ({"oversized": True}, "must be at most 262144 bytes serialized"),
    ],
    ids=["list", "string", "oversized"],
)
async def test_returning_anything_else_fails_the_attempt_with_a_clear_error(stub, app, value, reason):
    payload = value if isinstance(value, dict) else {"value": value}
    job = (await enqueue(stub, "test.returns", payload, max_attempts=1)).job

    done = await wait_for_terminal(stub, job.id)

    assert done.status == FAILED and not done.HasField("result")
    assert done.error_type == "InvalidResult"
    assert done.error_message == f"the handler returned an invalid result: result: {reason}"

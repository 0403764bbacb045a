"""What a handler author meets through the real server: the payload's numbers as
Python gives them, and a failed attempt's exception type on the job
(`Job.error_type`) and in its events (DESIGN §9 Errors that help)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from leasehold._server.jobs.records import NewJob
from leasehold.v1 import jobs_pb2
from leasehold.worker import HandlerRegistry, JobContext
from tests.api.helpers import (
    collect_events,
    enqueue,
    get_job,
    wait_for_event,
    wait_for_terminal,
)
from tests.support import OWNER, Gate, test_registry

FAILED = jobs_pb2.JOB_STATUS_FAILED
SUCCEEDED = jobs_pb2.JOB_STATUS_SUCCEEDED


class QuotaExceeded(Exception):
    """A handler's own exception class."""


@dataclass
class Seen:
    """The payloads `test.count` was handed, as Python objects."""

    payloads: list[dict[str, Any]] = field(default_factory=list)

    async def count(self, ctx: JobContext) -> None:
        self.payloads.append(ctx.payload)
        for tick in range(ctx.payload["n"]):  # a TypeError if n arrived as 3.0
            await ctx.append_event("tick", {"tick": tick})


async def missing_key(ctx: JobContext) -> None:
    ctx.payload["document_id"]  # the payload has none: KeyError


async def over_quota(ctx: JobContext) -> None:
    raise QuotaExceeded("quota exceeded")


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def registry(gate: Gate, seen: Seen) -> HandlerRegistry:
    kinds = test_registry(gate)
    kinds.register("test.count", seen.count)
    kinds.register("test.missing-key", missing_key)
    kinds.register("test.over-quota", over_quota)
    return kinds


# ----- numbers ---------------------------------------------------------------------


async def test_integral_numbers_reach_the_handler_as_int(stub, app, seen: Seen) -> None:
    payload = {
        "n": 3,
        "f": 2.5,
        "big": float(2**60),
        "edge": -(2**53),
        "past_edge": float(2**53 + 2),
        "flag": True,
        "nested": {"l": [1, 2.0, {"deep": 7}]},
    }
    job = (await enqueue(stub, "test.count", payload)).job

    finished = await wait_for_terminal(stub, job.id)

    assert finished.status == SUCCEEDED, finished.error_message
    (got,) = seen.payloads
    assert got == {
        "n": 3,
        "f": 2.5,
        "big": float(2**60),
        "edge": -(2**53),
        "past_edge": float(2**53 + 2),
        "flag": True,
        "nested": {"l": [1, 2, {"deep": 7}]},
    }
    types = {key: type(got[key]) for key in ("n", "f", "big", "edge", "past_edge", "flag")}
    assert types == {"n": int, "f": float, "big": float, "edge": int, "past_edge": float, "flag": bool}
    assert [type(item) for item in got["nested"]["l"][:2]] == [int, int]
    assert type(got["nested"]["l"][2]["deep"]) is int
    ticks = [e.payload["tick"] for e in await collect_events(stub, job.id) if e.type == "tick"]
    assert ticks == [0, 1, 2]


# ----- error_type ------------------------------------------------------------------


async def test_a_failed_attempt_records_its_exception_class(stub, app) -> None:
    job = (await enqueue(stub, "test.missing-key", max_attempts=2)).job

    scheduled = await wait_for_event(stub, job.id, "job.retry_scheduled")
    waiting = await get_job(stub, job.id)
    finished = await wait_for_terminal(stub, job.id, timeout=30)
    failed = (await collect_events(stub, job.id))[-1]

    assert (scheduled.payload["error"], scheduled.payload["error_type"]) == ("'document_id'", "KeyError")
    assert (waiting.error_message, waiting.error_type) == ("'document_id'", "KeyError")
    assert finished.status == FAILED
    assert (finished.error_message, finished.error_type) == ("'document_id'", "KeyError")
    assert failed.type == "job.failed"
    assert dict(failed.payload) == {"error": "'document_id'", "error_type": "KeyError"}


async def test_a_handlers_own_exception_is_named_by_its_class_name(stub, app) -> None:
    job = (await enqueue(stub, "test.over-quota", max_attempts=1)).job

    finished = await wait_for_terminal(stub, job.id)

    # The class's __name__, not its module path.
    assert (finished.error_message, finished.error_type) == ("quota exceeded", "QuotaExceeded")


async def test_a_job_no_handler_serves_fails_as_unknown_kind(stub, app) -> None:
    # Enqueue refuses kinds nobody serves, so this job is written the way one is
    # left behind when a handler is removed: straight into storage.
    assert app.repository is not None
    job, _ = await app.repository.enqueue(
        NewJob(owner_id=OWNER, kind="test.removed", payload={}, max_attempts=1)
    )

    finished = await wait_for_terminal(stub, job.id)

    assert finished.status == FAILED
    assert finished.error_type == "UnknownKind"
    assert finished.error_message == "no handler is registered for kind 'test.removed'"


async def test_a_success_after_a_failure_clears_the_error_type(stub, app) -> None:
    job = (await enqueue(stub, "example.fail", {"message": "once", "times": 1}, max_attempts=2)).job

    await wait_for_event(stub, job.id, "job.retry_scheduled")
    assert (await get_job(stub, job.id)).error_type == "RuntimeError"
    finished = await wait_for_terminal(stub, job.id, timeout=30)

    assert finished.status == SUCCEEDED
    assert (finished.error_message, finished.error_type) == ("", "")
    assert not finished.HasField("cancel_requested_at")

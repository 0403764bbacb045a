"""One handler, run by `leasehold.testing` and by the real service (gRPC,
runtime, SQLite): the same event log and the same outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from leasehold.testing import JobEnvironment
from leasehold.v1 import jobs_pb2
from leasehold.worker import HandlerRegistry, JobContext
from tests.api.helpers import Stub, collect_events, enqueue, wait_for_terminal
from tests.support import sqlite_url

KIND = "test.flaky-progress"
PAYLOAD = {"document": "d-7", "steps": 2}
# Timestamps inside payloads differ between the two runs by construction.
TIMES = ("available_at",)


async def flaky_progress(ctx: JobContext) -> None:
    """Two progress events, then a failure on the first attempt only. (int():
    numbers reach handlers as they travel in a protobuf Struct, as floats.)"""
    for step in range(1, int(ctx.payload["steps"]) + 1):
        await ctx.append_event("progress", {"step": step, "document": ctx.payload["document"]})
    if ctx.attempt == 1:
        raise RuntimeError("the index was busy")


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: this compares against one real service, not engines."""
    return sqlite_url(tmp_path)


@pytest.fixture
def registry() -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(KIND, flaky_progress)
    return registry


def _comparable(payload: dict[str, Any]) -> dict[str, Any]:
    return {key: "<time>" if key in TIMES else value for key, value in payload.items()}


async def test_the_environment_records_what_the_service_records(stub: Stub) -> None:
    response = await enqueue(stub, KIND, PAYLOAD, max_attempts=2)
    job = await wait_for_terminal(stub, response.job.id)
    served = [
        (event.type, _comparable(json_format.MessageToDict(event.payload)))
        for event in await collect_events(stub, job.id)
    ]

    run = await JobEnvironment().run(flaky_progress, PAYLOAD, kind=KIND, max_attempts=2)
    tested = [(event.type, _comparable(event.payload)) for event in run.events]

    assert tested == served
    assert [t for t, _ in tested].count("job.retry_scheduled") == 1  # the comparison saw a retry
    assert (run.status, run.attempts, run.error_message or "") == (
        jobs_pb2.JobStatus.Name(job.status).removeprefix("JOB_STATUS_").lower(),
        job.attempt,
        job.error_message,
    )
    assert (run.status, run.attempts) == ("succeeded", 2)

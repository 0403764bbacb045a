"""Existence never leaks (DESIGN §2 status codes).

Another owner's job and an id nobody has get the same PERMISSION_DENIED, with the
message `job <id> not found or not accessible`, and the same bytes on the wire:
code, message, grpc-status-details-bin, every trailer and header.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import (
    by_id_call,
    collect_events,
    enqueue,
    expect_error,
    get_job,
    list_all,
    start_gate_job,
    wait_for_terminal,
)
from tests.support import OTHER_OWNER, OWNER, owner_metadata, sqlite_url, test_registry

THIRD_OWNER = "carol"
UNKNOWN_ID = "job_" + "f" * 32
RPCS = ["Get", "Cancel", "Retry", "WatchEvents"]


async def _denied(stub, rpc: str, job_id: str, owner: str, after: int = 0) -> dict[str, Any]:
    """Everything the caller can observe of the denial."""
    err = await expect_error(by_id_call(stub, rpc, job_id, owner, after), grpc.StatusCode.PERMISSION_DENIED)
    assert err.details() == f"job {job_id} not found or not accessible"
    return {
        "code": err.code(),
        "details": err.details(),
        "initial": [(k, v) for k, v in (err.initial_metadata() or ())],
        "trailing": [(k, v) for k, v in (err.trailing_metadata() or ())],
    }


def _with_id(observed: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """The same observation with one job id swapped for another (same length)."""
    assert len(old) == len(new)

    def swap(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.replace(old.encode(), new.encode())
        if isinstance(value, str):
            return value.replace(old, new)
        return value

    return {
        "code": observed["code"],
        "details": swap(observed["details"]),
        "initial": [(k, swap(v)) for k, v in observed["initial"]],
        "trailing": [(k, swap(v)) for k, v in observed["trailing"]],
    }


@pytest.mark.parametrize("rpc", RPCS)
async def test_foreign_and_unknown_jobs_are_denied_identically(stub, app, rpc):
    job = await start_gate_job(stub, owner=OWNER)  # running, with events to leak

    foreign = await _denied(stub, rpc, job.id, OTHER_OWNER)
    unknown = await _denied(stub, rpc, UNKNOWN_ID, OTHER_OWNER)

    assert any(key == "grpc-status-details-bin" for key, _ in foreign["trailing"])
    assert foreign == _with_id(unknown, UNKNOWN_ID, job.id)
    # The same denial for a third owner, byte for byte.
    assert await _denied(stub, rpc, job.id, THIRD_OWNER) == foreign


@pytest.mark.parametrize("after", [0, 2, 1000])
async def test_watch_of_a_foreign_job_is_denied_at_any_after_sequence(stub, app, after):
    job = (await enqueue(stub, owner=OWNER)).job
    await wait_for_terminal(stub, job.id, owner=OWNER)

    foreign = await _denied(stub, "WatchEvents", job.id, OTHER_OWNER, after)
    unknown = await _denied(stub, "WatchEvents", UNKNOWN_ID, OTHER_OWNER, after)
    assert foreign == _with_id(unknown, UNKNOWN_ID, job.id)


async def test_the_same_id_denied_as_foreign_and_as_unknown_is_byte_identical(stub, app, tmp_path: Path):
    """Literally the same id: foreign on this server, unknown on a second one with its
    own empty database."""
    job = await start_gate_job(stub, owner=OWNER)
    second = LeaseholdApp(
        Settings(database_url=sqlite_url(tmp_path, "second.db"), listen="127.0.0.1:0"),
        clock=SystemClock(),
        registry=test_registry(),
    )
    await second.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as channel:
            second_stub = jobs_pb2_grpc.JobServiceStub(channel)
            for rpc in RPCS:
                foreign = await _denied(stub, rpc, job.id, OTHER_OWNER)
                unknown = await _denied(second_stub, rpc, job.id, OTHER_OWNER)
                assert foreign == unknown, rpc
    finally:
        await second.stop(grace_seconds=0.5)


async def test_another_owner_cannot_change_or_copy_a_job(stub, app):
    job = await start_gate_job(stub, owner=OWNER)
    events_before = await _events_so_far(stub, job.id)

    for rpc in ("Cancel", "Retry"):
        await _denied(stub, rpc, job.id, OTHER_OWNER)

    after = await get_job(stub, job.id, owner=OWNER)
    assert after.status == jobs_pb2.JOB_STATUS_RUNNING
    assert not after.HasField("cancel_requested_at")
    assert await _events_so_far(stub, job.id) == events_before
    assert [j.id for j in await list_all(stub, owner=OWNER)] == [job.id]
    assert await list_all(stub, owner=OTHER_OWNER) == []


async def _events_so_far(stub, job_id: str) -> list[tuple[int, str]]:
    """The running job's log up to now: read until job.started, the last event a
    running gate job has."""
    call = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id), metadata=owner_metadata())
    seen = []
    try:
        async for response in call:
            seen.append((response.event.sequence, response.event.type))
            if response.event.type == "job.started":
                return seen
    finally:
        call.cancel()
    raise AssertionError(seen)


async def test_owner_still_sees_its_job_after_foreign_attempts(stub, app):
    job = (await enqueue(stub, owner=OWNER)).job
    await _denied(stub, "Get", job.id, OTHER_OWNER)
    assert (await wait_for_terminal(stub, job.id, owner=OWNER)).status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert len(await collect_events(stub, job.id, owner=OWNER)) == 4

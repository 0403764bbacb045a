"""WatchEvents: replay, live follow, resume without gaps or duplicates (DESIGN §2, §4)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    WAIT,
    collect_events,
    enqueue,
    event_summary,
    fill_slots,
    get_job,
    start_gate_job,
    struct,
    wait_for_terminal,
)
from tests.support import owner_metadata

ECHO_PAYLOAD = {"text": "hello", "n": 3, "nested": {"ok": True, "items": [1, "two", None]}}


def _watch(stub, job_id: str, after: int = 0):
    return stub.WatchEvents(
        jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=after), metadata=owner_metadata()
    )


async def _finished_echo(stub) -> tuple[str, list[jobs_pb2.JobEvent]]:
    job = (await enqueue(stub, "example.echo", ECHO_PAYLOAD)).job
    await wait_for_terminal(stub, job.id)
    return job.id, await collect_events(stub, job.id)


async def test_full_replay_of_a_finished_job(stub, app):
    job_id, events = await _finished_echo(stub)

    assert event_summary(events) == [
        (1, "job.queued"),
        (2, "job.started"),
        (3, "echo"),
        (4, "job.succeeded"),
    ]
    assert all(event.job_id == job_id for event in events)
    assert events[0].payload == struct({})
    assert events[1].payload == struct({"attempt": 1})
    assert events[2].payload == struct(ECHO_PAYLOAD)
    stamps = [event.created_at.ToNanoseconds() for event in events]
    assert all(stamps) and stamps == sorted(stamps)
    # Replaying again gives the same log, message for message.
    assert await collect_events(stub, job_id) == events


async def test_live_follow_shows_progress_as_it_happens(stub, app):
    job = (await enqueue(stub, "example.sleep", {"seconds": 0.3, "steps": 3})).job
    received: list[tuple[jobs_pb2.JobEvent, float]] = []
    call = _watch(stub, job.id)
    async with asyncio.timeout(WAIT):
        async for response in call:
            received.append((response.event, time.time()))
    assert await call.code() == grpc.StatusCode.OK

    events = [event for event, _ in received]
    assert event_summary(events) == [
        (1, "job.queued"),
        (2, "job.started"),
        (3, "progress"),
        (4, "progress"),
        (5, "progress"),
        (6, "job.succeeded"),
    ]
    for step, event in enumerate(events[2:5], start=1):
        assert event.payload == struct({"step": step, "steps": 3})
    # Delivered live: the first progress event reached us before the job had finished.
    finished = await get_job(stub, job.id)
    first_progress_seen_at = received[2][1]
    assert first_progress_seen_at < finished.completed_at.ToNanoseconds() / 1e9


async def test_live_follow_waits_for_a_running_job_and_ends_after_its_terminal_event(stub, app, gate):
    job = await start_gate_job(stub)
    call = _watch(stub, job.id)

    first = await call.read()
    second = await call.read()
    assert [first.event.type, second.event.type] == ["job.queued", "job.started"]
    # The stream is still open while the job runs.
    assert (await get_job(stub, job.id)).status == jobs_pb2.JOB_STATUS_RUNNING
    assert not call.done()

    gate.release.set()
    async with asyncio.timeout(WAIT):
        last = await call.read()
        end = await call.read()
    assert (last.event.sequence, last.event.type) == (3, "job.succeeded")
    assert end is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_resume_after_every_sequence_yields_exactly_the_rest(stub, app):
    job_id, events = await _finished_echo(stub)

    for after in range(len(events) + 1):
        assert await collect_events(stub, job_id, after=after) == events[after:], after


@pytest.mark.parametrize("beyond", [0, 1, 1000, 2**63 - 1 - 4])
async def test_after_sequence_at_or_past_the_end_of_a_finished_job_ends_at_once(stub, app, beyond):
    job_id, events = await _finished_echo(stub)
    assert len(events) == 4

    assert await collect_events(stub, job_id, after=len(events) + beyond, timeout=5) == []


async def test_after_sequence_past_the_end_of_a_running_job_ends_when_it_finishes(stub, app, gate):
    job = await start_gate_job(stub)
    watcher = asyncio.create_task(collect_events(stub, job.id, after=100))
    gate.release.set()
    assert await watcher == []
    assert (await get_job(stub, job.id)).status == jobs_pb2.JOB_STATUS_SUCCEEDED


async def test_a_watcher_that_reconnects_from_its_last_sequence_sees_no_gap_and_no_duplicate(stub, app):
    job = (await enqueue(stub, "example.sleep", {"seconds": 0.5, "steps": 5})).job
    seen: list[jobs_pb2.JobEvent] = []

    call = _watch(stub, job.id)
    async with asyncio.timeout(WAIT):
        async for response in call:
            seen.append(response.event)
            if response.event.type == "progress":
                break
    call.cancel()
    assert await call.code() == grpc.StatusCode.CANCELLED

    seen += await collect_events(stub, job.id, after=seen[-1].sequence)

    assert [event.sequence for event in seen] == list(range(1, 9))
    assert seen == await collect_events(stub, job.id)
    assert seen[-1].type == "job.succeeded"


async def test_twenty_concurrent_watchers_see_the_identical_log(stub, app):
    job = (await enqueue(stub, "example.sleep", {"seconds": 0.3, "steps": 3})).job

    logs = await asyncio.gather(*(collect_events(stub, job.id) for _ in range(20)))

    assert all(log == logs[0] for log in logs)
    assert [event.sequence for event in logs[0]] == list(range(1, 7))
    assert logs[0][-1].type == "job.succeeded"


async def test_watchers_joining_at_different_points_agree(stub, app, gate):
    job = await start_gate_job(stub)
    early = [asyncio.create_task(collect_events(stub, job.id)) for _ in range(5)]
    resumed = [asyncio.create_task(collect_events(stub, job.id, after=after)) for after in (1, 2)]

    gate.release.set()
    full = await early[0]
    assert [await task for task in early] == [full] * 5
    assert [await task for task in resumed] == [full[1:], full[2:]]
    assert event_summary(full) == [(1, "job.queued"), (2, "job.started"), (3, "job.succeeded")]


async def test_watching_a_queued_job_that_is_cancelled(stub, app):
    await fill_slots(stub)
    job = (await enqueue(stub, "example.echo")).job
    watcher = asyncio.create_task(collect_events(stub, job.id))

    await stub.Cancel(jobs_pb2.CancelRequest(job_id=job.id), metadata=owner_metadata())

    assert event_summary(await watcher) == [(1, "job.queued"), (2, "job.cancelled")]


async def test_replay_of_a_log_longer_than_one_read_batch(stub, app):
    # example.sleep with 501 steps writes 504 events: more than the server reads at once.
    job = (await enqueue(stub, "example.sleep", {"seconds": 0, "steps": 501})).job
    await wait_for_terminal(stub, job.id, timeout=60)

    events = await collect_events(stub, job.id)

    assert [event.sequence for event in events] == list(range(1, 505))
    assert [event.payload.fields["step"].number_value for event in events[2:-1]] == list(range(1, 502))
    assert events[-1].type == "job.succeeded"
    assert await collect_events(stub, job.id, after=499) == events[499:]

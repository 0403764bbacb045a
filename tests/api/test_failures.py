"""Failing attempts seen through the API: retry with backoff, final failure, timeout,
error text bounds (DESIGN §3 Failure, §4 events)."""

from __future__ import annotations

from datetime import datetime, timedelta

from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    collect_events,
    enqueue,
    event_summary,
    get_job,
    struct,
    wait_for_event,
    wait_for_terminal,
)

FAILED = jobs_pb2.JOB_STATUS_FAILED
SUCCEEDED = jobs_pb2.JOB_STATUS_SUCCEEDED
TIMEOUT_TEXT = "Background job timed out."


async def test_failed_attempt_is_retried_after_backoff_and_then_succeeds(stub, app):
    job = (await enqueue(stub, "example.fail", {"message": "boom", "times": 1}, max_attempts=3)).job

    scheduled = await wait_for_event(stub, job.id, "job.retry_scheduled")
    # During the backoff the job is queued again, with the error and the due time.
    waiting = await get_job(stub, job.id)
    assert waiting.status == jobs_pb2.JOB_STATUS_QUEUED
    assert waiting.attempt == 1
    assert waiting.error_message == "boom"
    assert waiting.error_type == "RuntimeError"

    finished = await wait_for_terminal(stub, job.id, timeout=30)
    events = await collect_events(stub, job.id)

    assert finished.status == SUCCEEDED
    assert finished.attempt == 2 and finished.max_attempts == 3
    assert finished.id == job.id  # retried in place: same job id
    assert event_summary(events) == [
        (1, "job.queued"),
        (2, "job.started"),
        (3, "job.retry_scheduled"),
        (4, "job.started"),
        (5, "job.succeeded"),
    ]
    assert events[1].payload == struct({"attempt": 1})
    assert events[3].payload == struct({"attempt": 2})
    retry = events[2]
    assert retry == scheduled
    assert retry.payload.fields["attempt"].number_value == 1
    assert retry.payload.fields["error"].string_value == "boom"
    assert retry.payload.fields["error_type"].string_value == "RuntimeError"
    # The success that followed cleared the failed attempt's error and its type.
    assert finished.error_message == "" and finished.error_type == ""
    available_at = datetime.fromisoformat(retry.payload.fields["available_at"].string_value)
    assert available_at == waiting.available_at.ToDatetime(tzinfo=available_at.tzinfo)
    # Backoff after attempt 1 is 2**1 = 2 seconds, counted from the failure.
    backoff = available_at - retry.created_at.ToDatetime(tzinfo=available_at.tzinfo)
    assert abs(backoff - timedelta(seconds=2)) < timedelta(milliseconds=50), backoff
    # And the second attempt did not start before it was due.
    assert events[3].created_at.ToDatetime(tzinfo=available_at.tzinfo) >= available_at


async def test_last_attempt_failing_fails_the_job(stub, app):
    job = (await enqueue(stub, "example.fail", {"message": "boom"}, max_attempts=1)).job

    finished = await wait_for_terminal(stub, job.id)
    events = await collect_events(stub, job.id)

    assert finished.status == FAILED
    assert finished.error_message == "boom"
    assert finished.error_type == "RuntimeError"
    assert finished.attempt == 1
    assert finished.HasField("completed_at")
    assert event_summary(events) == [(1, "job.queued"), (2, "job.started"), (3, "job.failed")]
    assert events[2].payload == struct({"error": "boom", "error_type": "RuntimeError"})


async def test_error_text_is_cut_to_1000_characters(stub, app):
    job = (await enqueue(stub, "example.fail", {"message": "e" * 5000}, max_attempts=1)).job

    finished = await wait_for_terminal(stub, job.id)
    failed_event = (await collect_events(stub, job.id))[-1]

    assert finished.error_message == "e" * 1000
    assert failed_event.payload.fields["error"].string_value == "e" * 1000


async def test_permanent_error_fails_at_once_despite_attempts_left(stub, app):
    job = (await enqueue(stub, "example.sleep", {"seconds": "soon"}, max_attempts=3)).job

    finished = await wait_for_terminal(stub, job.id)

    assert finished.status == FAILED
    assert finished.attempt == 1
    assert "seconds" in finished.error_message
    assert finished.error_type == "PermanentError"
    assert [e.type for e in await collect_events(stub, job.id)][-1] == "job.failed"


async def test_handler_past_its_timeout_fails_with_the_fixed_text(stub, app, gate):
    # The gate is never released: only the timeout can end this attempt.
    job = (await enqueue(stub, "test.gate", timeout_seconds=1, max_attempts=1)).job

    finished = await wait_for_terminal(stub, job.id)
    events = await collect_events(stub, job.id)

    assert gate.started.is_set()
    assert finished.status == FAILED
    assert finished.error_message == TIMEOUT_TEXT
    assert finished.error_type == "TimeoutError"
    assert event_summary(events) == [(1, "job.queued"), (2, "job.started"), (3, "job.failed")]
    assert events[2].payload == struct({"error": TIMEOUT_TEXT, "error_type": "TimeoutError"})
    ran_for = finished.completed_at.ToDatetime() - finished.started_at.ToDatetime()
    assert ran_for >= timedelta(seconds=0.95), ran_for

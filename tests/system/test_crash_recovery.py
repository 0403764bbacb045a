"""A `leasehold serve` killed with SIGKILL mid-job: the next process on the same
SQLite file recovers the job through its expired lease, and nothing that was
acknowledged before the kill is lost."""

from __future__ import annotations

import itertools
import signal

import pytest

from leasehold.v1 import jobs_pb2
from tests.system.helpers import (
    EXIT_SECONDS,
    SECRET_MARKER,
    Client,
    Leasehold,
    assert_gap_free,
    event_payload,
    job_row,
    types,
)

pytestmark = pytest.mark.slow

# 30 steps of 0.1 s: the first attempt is killed after its first step, the
# recovered second attempt runs all 30.
SLEEP_PAYLOAD = {"seconds": 3, "steps": 30, "note": SECRET_MARKER}
LATE_PAYLOAD = {"seconds": 0.5, "steps": 5, "note": SECRET_MARKER}


def test_sigkilled_job_is_recovered_by_the_next_process(database_url: str, processes) -> None:
    first = processes(Leasehold.serve(database_url, "--lease-seconds", "6", "--concurrency", "2"))
    with Client(first.start()) as client:
        job = client.enqueue("example.sleep", SLEEP_PAYLOAD)
        client.events_until(job.id, lambda event: event.type == "progress")
        # Acknowledged right before the crash: it must survive it.
        late = client.enqueue("example.sleep", LATE_PAYLOAD)
    first.kill()
    assert first.returncode == -signal.SIGKILL

    # The dead process still holds the lease: the row says running, attempt 1.
    stranded = job_row(database_url, job.id)
    assert (stranded["status"], stranded["attempt"]) == ("running", 1)
    assert stranded["lease_owner"]

    second = processes(Leasehold.serve(database_url, "--lease-seconds", "6"))
    with Client(second.start()) as client:
        assert client.get(late.id).id == late.id
        events = client.all_events(job.id, timeout=40)  # ends after the terminal event
        done = client.get(job.id)
        late_events = client.all_events(late.id, timeout=40)
        late_done = client.get(late.id)
    assert second.interrupt() < EXIT_SECONDS and second.returncode == 0

    assert (done.status, done.attempt) == (jobs_pb2.JOB_STATUS_SUCCEEDED, 2)
    assert_gap_free(events)
    # Collapse each run of progress events into one entry to check the shape.
    shape = [kind for kind, _ in itertools.groupby(types(events))]
    assert shape == [
        "job.queued",
        "job.started",
        "progress",
        "job.lease_expired",
        "job.started",
        "progress",
        "job.succeeded",
    ], types(events)
    started = [event_payload(e) for e in events if e.type == "job.started"]
    assert started == [{"attempt": 1}, {"attempt": 2}]
    expired = [event_payload(e) for e in events if e.type == "job.lease_expired"]
    assert expired == [{"attempt": 1}]
    # The second attempt reports every step, in order, after the expiry.
    after_expiry = events[types(events).index("job.lease_expired") :]
    steps = [event_payload(e)["step"] for e in after_expiry if e.type == "progress"]
    assert steps == list(range(1, 31))

    assert late_done.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert late_done.attempt in (1, 2)  # 2 when the kill caught it running
    assert_gap_free(late_events)
    assert late_events[0].type == "job.queued" and late_events[-1].type == "job.succeeded"

    # Structured logs: who ran what, by id and kind, never the payload.
    (first_start,) = first.events_for("job.started", job.id)
    assert (first_start["kind"], first_start["attempt"]) == ("example.sleep", 1)
    assert not first.events_for("job.completed", job.id)
    (second_start,) = second.events_for("job.started", job.id)
    assert (second_start["kind"], second_start["attempt"]) == ("example.sleep", 2)
    (completed,) = second.events_for("job.completed", job.id)
    assert (completed["kind"], completed["attempt"]) == ("example.sleep", 2)
    for process in (first, second):
        assert SECRET_MARKER not in process.output

"""Ctrl-C (SIGINT) and SIGTERM: `leasehold serve` exits promptly with status 0, and
a job it was running is handed back to the queue, so the next process runs it at once."""

from __future__ import annotations

import itertools
import signal

import grpc
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_idle_server_exits_promptly_with_status_zero(database_url: str, processes, signum: int) -> None:
    server = processes(Leasehold.serve(database_url))
    with Client(server.start()) as client:
        assert client.list_all() == []  # it serves
    took = server.interrupt(signum=signum)
    assert server.returncode == 0, server.output[-2000:]
    assert took < EXIT_SECONDS
    assert server.events("server.stopping") and server.events("server.stopped")
    assert "Traceback" not in server.output


def test_ctrl_c_during_a_job_hands_it_back_for_the_next_process(database_url: str, processes) -> None:
    first = processes(Leasehold.serve(database_url, "--lease-seconds", "6"))
    with Client(first.start()) as client:
        job = client.enqueue("example.sleep", {"seconds": 3, "steps": 30, "note": SECRET_MARKER})
        # Keep a watcher attached through the shutdown, as a real client would be.
        call = client.watch(job.id, 0, timeout=30)
        seen = []
        for response in call:
            seen.append(response.event)
            if response.event.type == "progress":
                break
        took = first.interrupt()
        # The stream does not hang: it ends once the server is gone.
        with pytest.raises(grpc.RpcError) as ended:
            for response in call:
                seen.append(response.event)
        assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert first.returncode == 0, first.output[-2000:]
    assert took < EXIT_SECONDS
    assert "Traceback" not in first.output

    # The interrupted attempt was handed back: queued, not counted, no lease.
    handed_back = job_row(database_url, job.id)
    assert (handed_back["status"], handed_back["attempt"]) == ("queued", 0)
    assert handed_back["lease_owner"] is None and handed_back["lease_token"] is None
    (started,) = first.events_for("job.started", job.id)
    assert (started["kind"], started["attempt"]) == ("example.sleep", 1)
    assert first.events_for("job.released", job.id)
    for outcome in ("job.completed", "job.failed", "job.cancelled"):
        assert not first.events_for(outcome, job.id)

    second = processes(Leasehold.serve(database_url, "--lease-seconds", "6"))
    with Client(second.start()) as client:
        events = client.all_events(job.id, timeout=40)
        done = client.get(job.id)
    assert second.interrupt() < EXIT_SECONDS and second.returncode == 0

    assert (done.status, done.attempt) == (jobs_pb2.JOB_STATUS_SUCCEEDED, 1)
    assert_gap_free(events)
    assert [kind for kind, _ in itertools.groupby(types(events))] == [
        "job.queued",
        "job.started",
        "progress",
        "job.released",
        "job.started",
        "progress",
        "job.succeeded",
    ], types(events)
    assert [event_payload(e) for e in events if e.type == "job.released"] == [{"attempt": 1}]
    (completed,) = second.events_for("job.completed", job.id)
    assert (completed["kind"], completed["attempt"]) == ("example.sleep", 1)
    for process in (first, second):
        assert SECRET_MARKER not in process.output

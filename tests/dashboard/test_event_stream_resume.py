"""The dashboard's event stream takes its resume point from the browser
(`Last-Event-ID`) or the URL (`?after=`): anything that is not a sequence
number WatchEvents can take is a 400 before the stream starts, never a 500
with a traceback or a stream cut half-way ("²" passes str.isdigit but not
int(); thirty nines overflow an int64 only once the watch is sent)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.dashboard.test_serve import Browserless
from tests.support import owner_metadata, sqlite_url
from tests.system.helpers import Leasehold

pytestmark = pytest.mark.slow


def _status_and_body(web: Browserless, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(web.base + path, headers=headers)
    try:
        with web._opener.open(request, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_odd_resume_points_are_a_400_and_a_good_one_resumes(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    server = processes(Leasehold.serve(sqlite_url(tmp_path), "--dashboard-listen", "127.0.0.1:0"))
    port = server.start()
    web = Browserless(str(server.started.dashboard))
    web.sign_in("ann")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        job = stub.Enqueue(jobs_pb2.EnqueueRequest(kind="example.echo"), metadata=owner_metadata("ann")).job
        request = jobs_pb2.WatchEventsRequest(job_id=job.id)
        assert [r.event.type for r in stub.WatchEvents(request, metadata=owner_metadata("ann"), timeout=30)][
            -1
        ] == ("job.succeeded")
    events = f"/jobs/{job.id}/events"

    for headers, path in [
        ({"Last-Event-ID": "²"}, events),
        ({"Last-Event-ID": "-1"}, events),
        ({}, events + "?after=" + "9" * 30),
        ({}, events + "?after=9223372036854775808"),  # 2^63
        ({}, events + "?after=1e3"),
    ]:
        status, body = _status_and_body(web, path, headers)
        assert (status, body) == (
            400,
            b"Last-Event-ID and after must be an event sequence number (0 to 2^63-1)\n",
        ), (
            headers,
            path,
        )

    status, body = _status_and_body(web, events, {"Last-Event-ID": "1"})
    assert status == 200
    ids = [line for line in body.decode().splitlines() if line.startswith("id: ")]
    assert ids[0] == "id: 2" and "event: end" in body.decode()
    status, _ = _status_and_body(web, events + "?after=9223372036854775807", {})
    assert status == 200  # the largest int64: valid, nothing after it
    assert "Traceback" not in server.output

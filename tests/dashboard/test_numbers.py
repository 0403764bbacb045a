"""The job page shows a result as the caller's JSON: integral numbers as
integers (`1024`, not the `1024.0` a protobuf Struct carries), and its live
event stream sends event payloads the same way."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.dashboard.test_serve import Browserless
from tests.support import owner_metadata, sqlite_url
from tests.system.helpers import TEST_HANDLERS, Leasehold

pytestmark = pytest.mark.slow


def test_the_job_page_and_its_stream_show_integers(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    server = processes(
        Leasehold.serve(
            sqlite_url(tmp_path), "--dashboard-listen", "127.0.0.1:0", "--handlers", *TEST_HANDLERS
        )
    )
    port = server.start()
    web = Browserless(str(server.started.dashboard))
    web.sign_in("ann")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        payload = struct_pb2.Struct()
        payload.update({"width": 1024, "ratio": 1.5})
        request = jobs_pb2.EnqueueRequest(kind="test.echo_result", payload=payload)
        job = stub.Enqueue(request, metadata=owner_metadata("ann")).job
        watch = jobs_pb2.WatchEventsRequest(job_id=job.id)
        assert list(stub.WatchEvents(watch, metadata=owner_metadata("ann"), timeout=30))[-1].event.type == (
            "job.succeeded"
        )

    _, _, escaped = web.get(f"/jobs/{job.id}")
    page = html.unescape(escaped)
    assert '"width": 1024\n' in page and '"width": 1024.0' not in page
    assert '"ratio": 1.5' in page
    _, _, stream = web.get(f"/jobs/{job.id}/events")
    echoed = [line for line in stream.splitlines() if line.startswith("data: ") and '"echo"' in line]
    assert json.loads(echoed[0].removeprefix("data: "))["payload"] == {"width": 1024, "ratio": 1.5}
    assert "1024.0" not in stream

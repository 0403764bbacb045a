"""Checkpoints across real processes: a `leasehold worker` SIGKILLed after its
handler's `await ctx.checkpoint(...)` returned loses nothing it was told was
saved; the next worker's attempt resumes from it. Real `leasehold serve` and
`leasehold worker` processes on a real database (each engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format

from leasehold.v1 import jobs_pb2
from tests.remote.support import serve, worker
from tests.system.helpers import Client, assert_gap_free, event_payload, types

pytestmark = pytest.mark.slow


def test_a_sigkilled_workers_checkpoint_is_where_the_next_attempt_resumes(
    tmp_path: Path, database_url: str, processes
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    server = serve(processes, database_url, records)
    gate = tmp_path / "gate"
    first = worker(processes, server.port, records)
    with Client(server.port) as client:
        job = client.enqueue("remote.resume", {"gate": str(gate)})
        # `checkpointed` is appended after the checkpoint call returned.
        client.events_until(job.id, lambda e: e.type == "checkpointed")

        first.kill()  # SIGKILL: no hand-back, no heartbeat after this
        gate.touch()
        worker(processes, server.port, records)
        done = client.wait_terminal(job.id, timeout=60)
        events = client.all_events(job.id)

    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED and done.attempt == 2
    assert types(events).count("job.lease_expired") == 1
    resumed = [event_payload(event) for event in events if event.type == "resumed"]
    assert resumed == [
        {"attempt": 1, "from": None},
        {"attempt": 2, "from": {"saved_by_attempt": 1}},
    ]
    assert json_format.MessageToDict(done.result) == {"resumed_from": {"saved_by_attempt": 1}}
    assert_gap_free(events)

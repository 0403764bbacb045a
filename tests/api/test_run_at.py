"""A run_at over gRPC (DESIGN §11): not started early, started on time. On a
server with no limits set, so the start is stamped when the wake-up's claim
begins; under limits it is stamped after the claim's count of running jobs
(tests/remote/test_limits_across_processes.py says why), one statement later."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf import timestamp_pb2

from tests.api.helpers import enqueue, get_job, wait_for_terminal


async def test_a_run_at_is_claimed_within_20_ms_of_coming_due(stub, app) -> None:
    run_at = datetime.now(UTC) + timedelta(seconds=0.4)
    when = timestamp_pb2.Timestamp()
    when.FromDatetime(run_at)
    job = (await enqueue(stub, "example.sleep", {"seconds": 0}, run_at=when)).job

    await wait_for_terminal(stub, job.id)
    started = (await get_job(stub, job.id)).started_at.ToDatetime(UTC)
    assert run_at <= started <= run_at + timedelta(milliseconds=20), started - run_at

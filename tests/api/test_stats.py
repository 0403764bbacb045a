"""JobService.GetStats over a real server and channel, on each SQL engine: the
caller's own jobs counted by status and by kind, every one of them (more than a
List page), wherever they moved, and never another owner's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf import timestamp_pb2

from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    FAILED,
    SUCCEEDED,
    Stub,
    enqueue,
    expect_error,
    expect_invalid,
    list_all,
    start_gate_job,
    struct,
    wait_for_terminal,
)
from tests.support import OWNER, Gate, owner_metadata

OTHER = "someone-else"
# More queued jobs than a List page holds (500 at most).
FUTURE_JOBS = 600


def _later() -> timestamp_pb2.Timestamp:
    when = timestamp_pb2.Timestamp()
    when.FromDatetime(datetime.now(UTC) + timedelta(days=30))
    return when


async def _stats(stub: Stub, owner: str = OWNER) -> jobs_pb2.GetStatsResponse:
    response: jobs_pb2.GetStatsResponse = await stub.GetStats(
        jobs_pb2.GetStatsRequest(), metadata=owner_metadata(owner)
    )
    return response


async def test_get_stats_counts_every_job_of_the_caller_alone(stub: Stub, gate: Gate) -> None:
    before = datetime.now(UTC)
    later = _later()
    await stub.BatchEnqueue(
        jobs_pb2.BatchEnqueueRequest(
            requests=[
                jobs_pb2.EnqueueRequest(kind="example.sleep", payload=struct(), run_at=later)
                for _ in range(FUTURE_JOBS)
            ]
        ),
        metadata=owner_metadata(),
    )
    running = await start_gate_job(stub)
    echo = (await enqueue(stub, "example.echo")).job.id
    failing = (await enqueue(stub, "example.fail", max_attempts=1)).job.id
    cancelled = (await enqueue(stub, "example.echo", run_at=later)).job.id
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=cancelled), metadata=owner_metadata())
    assert (await wait_for_terminal(stub, echo)).status == SUCCEEDED
    assert (await wait_for_terminal(stub, failing)).status == FAILED
    for kind in ("example.echo", "test.gate"):
        await enqueue(stub, kind, owner=OTHER, run_at=later)

    stats = await _stats(stub)

    assert stats.total == jobs_pb2.JobCounts(
        queued=FUTURE_JOBS, running=1, succeeded=1, failed=1, cancelled=1
    )
    assert [(k.kind, k.counts) for k in stats.kinds] == [
        ("example.echo", jobs_pb2.JobCounts(succeeded=1, cancelled=1)),
        ("example.fail", jobs_pb2.JobCounts(failed=1)),
        ("example.sleep", jobs_pb2.JobCounts(queued=FUTURE_JOBS)),
        ("test.gate", jobs_pb2.JobCounts(running=1)),
    ]
    assert not stats.kinds_truncated
    assert before <= stats.computed_at.ToDatetime(UTC) <= datetime.now(UTC)
    assert len(await list_all(stub)) == FUTURE_JOBS + 4  # what List walks, page after page

    other = await _stats(stub, OTHER)
    assert other.total == jobs_pb2.JobCounts(queued=2)
    assert [(k.kind, k.counts.queued) for k in other.kinds] == [("example.echo", 1), ("test.gate", 1)]

    gate.release.set()
    assert (await wait_for_terminal(stub, running.id)).status == SUCCEEDED
    after = await _stats(stub)
    assert (after.total.running, after.total.succeeded) == (0, 2)


async def test_a_stranger_has_nothing_and_no_owner_is_refused(stub: Stub, channel: grpc.aio.Channel) -> None:
    await enqueue(stub, "example.echo", run_at=_later())

    stranger = await _stats(stub, "nobody-yet")
    assert stranger.total == jobs_pb2.JobCounts() and list(stranger.kinds) == []

    await expect_error(stub.GetStats(jobs_pb2.GetStatsRequest()), grpc.StatusCode.UNAUTHENTICATED)
    await expect_error(
        stub.GetStats(jobs_pb2.GetStatsRequest(), metadata=(("x-owner-id", "bad owner"),)),
        grpc.StatusCode.UNAUTHENTICATED,
    )
    undecodable = channel.unary_unary("/leasehold.v1.JobService/GetStats")(
        b"\x0a\xff", metadata=owner_metadata()
    )  # a length-delimited field that claims more bytes than follow
    await expect_invalid(undecodable, "request")

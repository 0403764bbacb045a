"""Checkpoints over WorkerService, on a real server, port and database (each
engine): a Heartbeat's checkpoint is saved with its renewal, fenced by the
lease, checked before anything is written, and handed to the next attempt in
`ClaimedJob.checkpoint`. The server runs on a manual clock, so a retry comes
due and a lease lapses when the test says, not after a wait."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import ManualClock
from leasehold._server.config import RuntimeSettings, Settings
from leasehold._server.runtime.registry import HandlerRegistry
from leasehold.v1 import jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.api.helpers import enqueue, expect_invalid, struct

TOKEN = secrets.token_urlsafe(24)
KIND = "remote.work"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
LEASE_SECONDS = 6.0


@pytest.fixture
async def app(
    database_url: str, registry: HandlerRegistry, clock: ManualClock
) -> AsyncIterator[LeaseholdApp]:
    settings = Settings(
        database_url=database_url,
        listen="127.0.0.1:0",
        runtime=RuntimeSettings(concurrency=1, lease_seconds=LEASE_SECONDS, poll_seconds=0.05),
        remote_kinds=("remote.*",),
        worker_token=TOKEN,
    )
    service = LeaseholdApp(settings, clock=clock, registry=registry)
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace_seconds=0.5)


@pytest.fixture
def worker(channel: grpc.aio.Channel) -> worker_pb2_grpc.WorkerServiceStub:
    return worker_pb2_grpc.WorkerServiceStub(channel)


async def claim_one(worker: worker_pb2_grpc.WorkerServiceStub) -> worker_pb2.ClaimedJob:
    request = worker_pb2.ClaimRequest(worker_id="w-test", kinds=[KIND], wait_seconds=0)
    (claimed,) = (await worker.Claim(request, metadata=AUTH)).jobs
    return claimed


def ref(claimed: worker_pb2.ClaimedJob, checkpoint: dict[str, Any] | None = None) -> worker_pb2.LeaseRef:
    return worker_pb2.LeaseRef(
        job_id=claimed.job.id,
        lease_token=claimed.lease_token,
        checkpoint=None if checkpoint is None else struct(checkpoint),
    )


async def beat(worker: worker_pb2_grpc.WorkerServiceStub, *refs: worker_pb2.LeaseRef) -> list[bool]:
    """Heartbeat `refs`; per lease, whether it was lost."""
    response = await worker.Heartbeat(worker_pb2.HeartbeatRequest(leases=list(refs)), metadata=AUTH)
    return [state.lost for state in response.states]


async def fail_and_come_due(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: worker_pb2.ClaimedJob, clock: ManualClock
) -> None:
    request = worker_pb2.FailRequest(
        job_id=claimed.job.id, lease_token=claimed.lease_token, error_message="flaky", retry_after_seconds=1
    )
    await worker.Fail(request, metadata=AUTH)
    clock.advance(2)


def nested(depth: int) -> dict[str, Any]:
    """An object `depth` objects or lists deep. Lists, because a list level is
    fewer protobuf levels than an object's: one just past the limit still
    decodes, so the server's own check is what refuses it."""
    value: list[Any] = [1]
    for _ in range(depth - 2):
        value = [value]
    return {"down": value}


async def test_the_server_offers_checkpoints(worker: worker_pb2_grpc.WorkerServiceStub) -> None:
    info = await worker.GetServerInfo(worker_pb2.GetServerInfoRequest(), metadata=AUTH)

    assert "checkpoints" in info.features


async def test_a_heartbeats_checkpoint_reaches_the_next_attempts_claim(
    stub: jobs_pb2_grpc.JobServiceStub, worker: worker_pb2_grpc.WorkerServiceStub, clock: ManualClock
) -> None:
    job_id = (await enqueue(stub, KIND, {"pages": 10})).job.id
    first = await claim_one(worker)
    assert not first.HasField("checkpoint")

    assert await beat(worker, ref(first, {"page": 3})) == [False]
    assert await beat(worker, ref(first)) == [False]  # unset keeps the one saved before
    await fail_and_come_due(worker, first, clock)
    second = await claim_one(worker)

    assert second.job.id == job_id and second.job.attempt == 2
    assert dict(second.checkpoint) == {"page": 3}


async def test_a_stale_leases_checkpoint_is_lost_and_never_stored(
    stub: jobs_pb2_grpc.JobServiceStub, worker: worker_pb2_grpc.WorkerServiceStub, clock: ManualClock
) -> None:
    await enqueue(stub, KIND)
    stale = await claim_one(worker)
    assert await beat(worker, ref(stale, {"page": 1})) == [False]
    clock.advance(LEASE_SECONDS + 1)
    current = await claim_one(worker)
    assert dict(current.checkpoint) == {"page": 1}

    assert await beat(worker, ref(stale, {"page": "stale"}), ref(current)) == [True, False]

    await fail_and_come_due(worker, current, clock)
    assert dict((await claim_one(worker)).checkpoint) == {"page": 1}


@pytest.mark.parametrize(
    ("checkpoint", "why"),
    [({"blob": "x" * (256 * 1024)}, "oversized"), (nested(33), "too deep")],
)
async def test_a_bad_checkpoint_is_refused_naming_it_and_nothing_is_saved(
    stub: jobs_pb2_grpc.JobServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    clock: ManualClock,
    checkpoint: dict[str, Any],
    why: str,
) -> None:
    await enqueue(stub, KIND)
    claimed = await claim_one(worker)
    good = ref(claimed, {"page": 2})

    await expect_invalid(
        worker.Heartbeat(worker_pb2.HeartbeatRequest(leases=[good, ref(claimed, checkpoint)]), metadata=AUTH),
        "leases[1].checkpoint",
    )

    await fail_and_come_due(worker, claimed, clock)
    assert not (await claim_one(worker)).HasField("checkpoint"), why

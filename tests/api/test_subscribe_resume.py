"""A feed subscriber that keeps only the last position it processed, killed a
hundred times at random points (between two events, and between receiving an
event and recording it), resumed each time from what it recorded, across a
server restart and a drain, sees every event of the owner exactly once, in the
order the database numbered them (DESIGN §17)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc

from leasehold._server.app import LeaseholdApp
from leasehold._server.config import RuntimeSettings, Settings
from leasehold._server.jobs.owner_feed import encode_position
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import WAIT, struct, wait_for_terminal
from tests.support import OWNER, owner_metadata, sqlite_url, test_registry

KILLS = 100
RESTART_AT = 33
DRAIN_AT = 66
SEED = 1717


async def started(url: str) -> LeaseholdApp:
    service = LeaseholdApp(
        Settings(
            database_url=url,
            listen="127.0.0.1:0",
            runtime=RuntimeSettings(concurrency=4, lease_seconds=6, poll_seconds=0.05),
        ),
        registry=test_registry(),
    )
    await service.start()
    return service


class Subscriber:
    """What a backend keeps: the events it processed, and the last position."""

    def __init__(self) -> None:
        self.processed: list[tuple[str, str, int]] = []
        self.position = ""

    def record(self, response: jobs_pb2.SubscribeResponse) -> None:
        self.processed.append((response.position, response.event.job_id, response.event.sequence))
        self.position = response.position

    async def run_until_killed(
        self, stub: jobs_pb2_grpc.JobServiceStub, budget: int, rng: random.Random
    ) -> None:
        """Process up to `budget` events (no more than are committed), then
        die; now and then die with one received but not yet recorded."""
        call = stub.Subscribe(
            jobs_pb2.SubscribeRequest(after_position=self.position), metadata=owner_metadata()
        )
        try:
            async with asyncio.timeout(WAIT):
                for _ in range(budget):
                    response = await call.read()
                    assert isinstance(response, jobs_pb2.SubscribeResponse)
                    if rng.random() < 0.1:
                        return  # killed after receiving, before recording
                    self.record(response)
        finally:
            call.cancel()


async def read_to_the_end(call: grpc.aio.UnaryStreamCall) -> grpc.StatusCode:
    """How the stream ended (the live events before that are skipped)."""
    try:
        while await call.read() is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def committed(service: LeaseholdApp) -> int:
    assert service.repository is not None
    return (await service.repository.feed_head(OWNER)).last_position


async def test_a_subscriber_killed_a_hundred_times_sees_every_event_once(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    rng = random.Random(SEED)
    subscriber = Subscriber()
    service = await started(url)
    job_ids: list[str] = []
    try:
        for kill in range(KILLS):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
                stub = jobs_pb2_grpc.JobServiceStub(channel)
                for _ in range(rng.randrange(3)):
                    request = jobs_pb2.EnqueueRequest(kind="example.echo", payload=struct({"n": kill}))
                    job_ids.append((await stub.Enqueue(request, metadata=owner_metadata())).job.id)
                done = len(subscriber.processed)
                budget = min(rng.randrange(1, 12), await committed(service) - done)
                if budget > 0:
                    await subscriber.run_until_killed(stub, budget, rng)
                if kill == DRAIN_AT:
                    # A stream open and waiting when the drain begins ends UNAVAILABLE.
                    call = stub.Subscribe(jobs_pb2.SubscribeRequest(tail=True), metadata=owner_metadata())
                    waiting = asyncio.ensure_future(read_to_the_end(call))
                    await asyncio.sleep(0.05)
                    await service.stop(grace_seconds=2)
                    ended = await asyncio.wait_for(waiting, WAIT)
                    assert ended == grpc.StatusCode.UNAVAILABLE, ended
            if kill in (RESTART_AT, DRAIN_AT):
                if kill == RESTART_AT:
                    await service.stop(grace_seconds=2)
                service = await started(url)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            for job_id in job_ids:
                await wait_for_terminal(stub, job_id)
            while len(subscriber.processed) < await committed(service):
                await subscriber.run_until_killed(
                    stub, await committed(service) - len(subscriber.processed), rng
                )
        assert service.repository is not None
        total = await committed(service)
        stored = (await service.repository.read_feed(OWNER, 0, total + 1)).events
    finally:
        await service.stop(grace_seconds=2)

    assert len(job_ids) > 50
    assert subscriber.processed == [
        (encode_position(numbered.position), numbered.event.job_id, numbered.event.sequence)
        for numbered in stored
    ]
    assert len(stored) == total == 4 * len(job_ids)

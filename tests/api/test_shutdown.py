"""The service stops promptly, whatever happens to be committing at that moment.

`LeaseholdApp.stop()` is what `leasehold serve` runs on Ctrl-C and what every test's
`app` fixture runs at teardown, so a stop that can hang is a hang everywhere.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import collect_events, enqueue, start_gate_job
from tests.support import Gate, sqlite_url, test_registry


def _service(tmp_path: Path, gate: Gate) -> LeaseholdApp:
    settings = Settings(
        database_url=sqlite_url(tmp_path, "shutdown.db"),
        listen="127.0.0.1:0",
        # A long safety-net poll: an idle claimer sits in its wake-up wait.
        runtime=RuntimeSettings(concurrency=4, lease_seconds=6, poll_seconds=5),
    )
    return LeaseholdApp(settings, clock=SystemClock(), registry=test_registry(gate))


async def test_service_stops_promptly_when_idle(tmp_path: Path):
    gate = Gate()
    service = _service(tmp_path, gate)
    await service.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        job = (await enqueue(stub, "example.echo")).job
        assert (await collect_events(stub, job.id))[-1].type == "job.succeeded"

    stopping = asyncio.create_task(service.stop(grace_seconds=0))
    done, _ = await asyncio.wait({stopping}, timeout=10)
    assert stopping in done


async def test_service_stops_when_work_is_announced_as_it_stops(tmp_path: Path):
    gate = Gate()
    service = _service(tmp_path, gate)
    await service.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        # Once job.started is visible the claimer has finished its claim and is
        # idle, waiting for a wake-up (the gate job holds its slot; nothing else
        # wakes it for five seconds).
        await start_gate_job(stub)
        assert (await stub.List(jobs_pb2.ListRequest(), metadata=(("x-owner-id", "alice"),))).jobs

    # Another client's Enqueue commits at the very moment the service is told to
    # stop. (Python 3.11's wait_for used to swallow the cancel in this case.)
    assert service.repository is not None
    service.repository.changes.publish_work()
    stopping = asyncio.create_task(service.stop(grace_seconds=0))
    done, _ = await asyncio.wait({stopping}, timeout=3)

    assert stopping in done, "LeaseholdApp.stop() did not return within 3 s"

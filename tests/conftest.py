from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2_grpc
from server.app import LeaseholdApp
from server.clock import ManualClock, SystemClock
from server.config import Settings
from server.jobs.repository import JobRepository
from server.runtime.registry import HandlerRegistry
from server.runtime.worker import RuntimeSettings
from tests.support import ENGINES, Gate, sqlite_url, test_registry
from tests.system.helpers import Leasehold


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=sorted(ENGINES))
async def repository(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[JobRepository]:
    """A migrated repository on each storage engine, on a manual clock."""
    repo = await ENGINES[request.param](tmp_path, clock)
    try:
        yield repo
    finally:
        await repo.close()


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def runtime_settings() -> RuntimeSettings:
    return RuntimeSettings(concurrency=4, lease_seconds=6, poll_seconds=0.05)


@pytest.fixture
def registry(gate: Gate) -> HandlerRegistry:
    """The kinds the `app` fixture serves; a module overrides it to add its own."""
    return test_registry(gate)


@pytest.fixture
async def app(
    tmp_path: Path, registry: HandlerRegistry, runtime_settings: RuntimeSettings
) -> AsyncIterator[LeaseholdApp]:
    """The whole service on a real port and a real SQLite file, system clock."""
    settings = Settings(
        database_url=sqlite_url(tmp_path),
        listen="127.0.0.1:0",
        runtime=runtime_settings,
    )
    service = LeaseholdApp(settings, clock=SystemClock(), registry=registry)
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace_seconds=0.5)


@pytest.fixture
async def channel(app: LeaseholdApp) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as chan:
        yield chan


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> jobs_pb2_grpc.JobServiceStub:
    return jobs_pb2_grpc.JobServiceStub(channel)


@pytest.fixture
def processes() -> Iterator[Callable[[Leasehold], Leasehold]]:
    """Track every `leasehold` process a test starts; SIGKILL any still alive at the end."""
    started: list[Leasehold] = []

    def track(process: Leasehold) -> Leasehold:
        started.append(process)
        return process

    yield track
    for process in started:
        process.kill()

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import settings

from bench.figures import node_drain
from leasehold._server import migrate
from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import ManualClock, SystemClock
from leasehold._server.config import Settings
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2_grpc
from leasehold.worker import HandlerRegistry
from tests.postgres_cluster import PostgresCluster, find_bin_dir
from tests.support import (
    ENGINES,
    REPORTED_FIGURE,
    REPOSITORY_ENGINES,
    Gate,
    fresh_database_url,
    make_repository,
    repository_on,
    require,
    test_registry,
)
from tests.system.helpers import Leasehold

# CI runs each property test on the examples its source derives, the same ones on
# every run, so that a submission lands or fails on its own change, never on a draw
# that happened to find an old gap. Run locally without it, each run draws afresh
# and keeps looking.
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# Files whose tests install, build or run the Node packages (clients/node and
# examples: their node_modules and dist/). The run's workers (pytest-xdist) each take
# whole files; while one of these runs, no other may, or it would see the tree that
# `npm ci` or `npm run build` is rewriting. The bench's Node figures take the same
# lock themselves, for just their part of the bench smoke run.
NODE_PACKAGE_USERS = frozenset(
    {
        "tests/examples/test_node_sdk.py",
        "tests/examples/test_node_examples.py",
        "tests/conformance/test_conformance.py",
        "tests/docs/test_readme_commands.py",
    }
)


@pytest.fixture(scope="module", autouse=True)
def node_packages_in_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """The lock for the whole of such a file (autouse and module-scoped, so it is
    taken before the file's own module fixtures)."""
    path = request.path.relative_to(request.config.rootpath).as_posix()
    if path not in NODE_PACKAGE_USERS:
        yield
        return
    with node_drain.packages_in_turn():
        yield


# What the experiments measured (rounds, recovery times, counts: tests/reliability's
# `figures`), in the order their tests finished, for one table at the end of the run.
# Collected here, in the process that writes the summary: under pytest-xdist the
# tests run in workers, and only their reports come back.
_REPORTED_FIGURES: list[tuple[str, str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        test = report.nodeid.split("::", 1)[-1]
        for key, value in report.user_properties:
            if key == REPORTED_FIGURE:
                name, measured = value
                _REPORTED_FIGURES.append((test, name, measured))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _REPORTED_FIGURES:
        return
    terminalreporter.section("reliability figures")
    current = None
    for test, name, value in _REPORTED_FIGURES:
        if test != current:
            terminalreporter.write_line(test)
            current = test
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        terminalreporter.write_line(f"    {name:<40} {shown}")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@dataclass
class Postgres:
    """The session's throwaway cluster, and a database migrated to head that
    every test's fresh database is copied from."""

    cluster: PostgresCluster
    template: str

    def fresh_database_url(self) -> str:
        return self.cluster.url(self.cluster.create_database(template=self.template, prefix="test"))


@pytest.fixture(scope="session")
def postgres_session() -> Iterator[Postgres | None]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        yield None
        return
    cluster = PostgresCluster(bin_dir)
    try:
        cluster.init().start()
        template = cluster.create_database(prefix="template")
        migrate.upgrade(cluster.url(template))
        yield Postgres(cluster, template)
    finally:
        cluster.destroy()


@pytest.fixture
def postgres(postgres_session: Postgres | None) -> Postgres:
    """The session's PostgreSQL; skips loudly without the server binaries (fails
    under LEASEHOLD_TESTS_STRICT=1, as in CI)."""
    require(postgres_session is not None, "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
    assert postgres_session is not None
    return postgres_session


@pytest.fixture(params=ENGINES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, migrated database on each storage engine: a SQLite file, or a
    new database in the session's PostgreSQL cluster."""
    return fresh_database_url(request.param, request, tmp_path)


@pytest.fixture(params=REPOSITORY_ENGINES)
async def repository(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[JobRepository]:
    """A repository on each engine (SQLite, PostgreSQL, in memory), on a manual clock."""
    repo = await repository_on(request.param, request, tmp_path, clock)
    try:
        yield repo
    finally:
        await repo.close()


Steered = Callable[..., Awaitable[JobRepository]]


@pytest.fixture(params=REPOSITORY_ENGINES)
async def steered(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Steered]:
    """Makes repositories on each engine with the options given (`steering_rules`,
    `jitter`), on the manual clock; each on a database of its own unless
    `share=` names an earlier one's (two processes on one database)."""
    made: list[JobRepository] = []
    urls: list[str] = []

    async def make(share: int | None = None, **options: Any) -> JobRepository:
        if request.param == "memory":
            assert share is None, "the memory engine has no database to share"
            repo: JobRepository = MemoryJobRepository(clock, **options)
        else:
            url = (
                urls[share]
                if share is not None
                else fresh_database_url(request.param, request, tmp_path / str(len(urls)))
            )
            urls.append(url)
            (tmp_path / str(len(urls) - 1)).mkdir(exist_ok=True)
            repo = await make_repository(url, clock, **options)
        made.append(repo)
        return repo

    try:
        yield make
    finally:
        for repo in made:
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
def extra_settings() -> dict[str, Any]:
    """More `Settings` for the `app` fixture; a module overrides it (remote kinds,
    the worker token)."""
    return {}


@pytest.fixture
async def app(
    database_url: str,
    registry: HandlerRegistry,
    runtime_settings: RuntimeSettings,
    extra_settings: dict[str, Any],
) -> AsyncIterator[LeaseholdApp]:
    """The whole service on a real port and a real database (each engine), system clock."""
    settings = Settings(
        database_url=database_url,
        listen="127.0.0.1:0",
        runtime=runtime_settings,
        **extra_settings,
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

"""Shared test helpers: the storage engines under test, owners and handlers."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from leasehold import examples
from leasehold._server import migrate
from leasehold._server.clock import Clock
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold.worker import HandlerRegistry, JobContext

OWNER = "alice"

# Set by .ci/run: a test that needs something this machine lacks (a mountable file
# system, libfaketime, PostgreSQL binaries) fails there instead of skipping.
STRICT_ENV = "LEASEHOLD_TESTS_STRICT"

# The key under which an experiment's `figures` (tests/reliability) travel in its
# report, to the table at the end of the run (tests/conftest.py).
REPORTED_FIGURE = "reliability figure"


def require(available: bool, what: str) -> None:
    """Skip the test with a loud reason when `what` is missing, or fail under
    LEASEHOLD_TESTS_STRICT=1 so CI can never pass by skipping an experiment."""
    if available:
        return
    message = f"NOT RUN: {what}"
    if os.environ.get(STRICT_ENV) == "1":
        pytest.fail(f"{message} (required because {STRICT_ENV}=1)")
    pytest.skip(message)


OTHER_OWNER = "bob"


def owner_metadata(owner: str = OWNER) -> tuple[tuple[str, str], ...]:
    return (("x-owner-id", owner),)


def sqlite_url(directory: Path, name: str = "leasehold.db") -> str:
    return f"sqlite+aiosqlite:///{directory / name}"


async def make_repository(url: str, clock: Clock, **options: Any) -> SqlJobRepository:
    """A repository on a migrated database at `url`."""
    await asyncio.to_thread(migrate.upgrade, url)
    return SqlJobRepository(create_engines(url), clock, **options)


async def make_sqlite_repository(directory: Path, clock: Clock) -> JobRepository:
    return await make_repository(sqlite_url(directory), clock)


# Every database engine the contract suite and the gRPC end-to-end suite run
# against (the `database_url` fixture in tests/conftest.py is parametrized over
# these). PostgreSQL runs in a throwaway cluster the session starts.
ENGINES = ("sqlite", "postgresql")
# Every engine behind the `JobRepository` seam: the databases, and the in-memory
# engine that backs `leasehold.testing`. The repository contract suite and the
# runtime tests run on all of them; suites that need a service on a database
# (gRPC end to end, reliability, storage) stay on ENGINES: the memory engine is
# never a stand-in for a database.
REPOSITORY_ENGINES = (*ENGINES, "memory")


def fresh_database_url(engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on `engine` (one of ENGINES): a SQLite file, or a new
    database in the session's PostgreSQL cluster (migrated to head)."""
    if engine == "sqlite":
        return sqlite_url(tmp_path)
    postgres = request.getfixturevalue("postgres")  # tests/conftest.py
    url: str = postgres.fresh_database_url()
    return url


async def repository_on(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, clock: Clock, **options: Any
) -> JobRepository:
    """A repository on `engine` (one of REPOSITORY_ENGINES): on a fresh migrated
    database, or a new in-memory one. `options`: the engines' shared keyword
    arguments (`steering_rules`, `jitter`)."""
    if engine == "memory":
        return MemoryJobRepository(clock, **options)
    return await make_repository(fresh_database_url(engine, request, tmp_path), clock, **options)


@dataclass
class Gate:
    """A handler kind (`test.gate`) that runs until the test opens the gate, so a
    test can act while a job is known to be running, without sleeping."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    contexts: list[JobContext] = field(default_factory=list)

    async def handler(self, ctx: JobContext) -> None:
        self.contexts.append(ctx)
        self.started.set()
        await self.release.wait()
        if ctx.payload.get("check_cancel"):
            await ctx.raise_if_cancelled()
        if ctx.payload.get("fail"):
            raise RuntimeError(str(ctx.payload["fail"]))


def test_registry(gate: Gate | None = None) -> HandlerRegistry:
    """The built-in example kinds, plus `test.gate` when a gate is given."""
    registry = HandlerRegistry()
    examples.register(registry)
    if gate is not None:
        registry.register("test.gate", gate.handler)
    return registry


test_registry.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test

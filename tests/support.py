"""Shared test helpers: storage engines under test, handlers, a served app, and
`leasehold serve` subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from server import migrate
from server.clock import Clock
from server.handlers import examples
from server.jobs.repository import JobRepository
from server.jobs.sql.engines import create_engines
from server.jobs.sql.repository import SqlJobRepository
from server.runtime.context import JobContext
from server.runtime.registry import HandlerRegistry

OWNER = "alice"
OTHER_OWNER = "bob"


def owner_metadata(owner: str = OWNER) -> tuple[tuple[str, str], ...]:
    return (("x-owner-id", owner),)


def sqlite_url(directory: Path, name: str = "leasehold.db") -> str:
    return f"sqlite+aiosqlite:///{directory / name}"


async def make_sqlite_repository(directory: Path, clock: Clock) -> JobRepository:
    url = sqlite_url(directory)
    await asyncio.to_thread(migrate.upgrade, url)
    return SqlJobRepository(create_engines(url), clock)


# Every storage engine the contract suite runs against: name -> factory.
ENGINES: dict[str, Callable[[Path, Clock], Awaitable[JobRepository]]] = {
    "sqlite": make_sqlite_repository,
}


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


class ServeProcess:
    """`leasehold serve` in a child process, on a free port it reports at start."""

    def __init__(self, database_url: str, *extra_args: str, env: dict[str, str] | None = None) -> None:
        self.args = [
            sys.executable,
            "-m",
            "server.cli",
            "serve",
            "--database-url",
            database_url,
            "--listen",
            "127.0.0.1:0",
            *extra_args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.log_lines: list[dict[str, object]] = []
        self._started = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> int:
        self.process = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        if not self._started.wait(timeout) or self.port is None:
            self.kill()
            raise RuntimeError(f"leasehold serve did not start: {self.log_lines[-5:]}")
        return self.port

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.log_lines.append(record)
            if record.get("event") == "server.started":
                self.port = int(record["port"])  # type: ignore[arg-type]
                self._started.set()
        self._started.set()

    def events(self, name: str) -> list[dict[str, object]]:
        return [record for record in self.log_lines if record.get("event") == name]

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, like a crash or power cut of the process."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def interrupt(self, timeout: float = 10.0) -> float:
        """SIGINT (Ctrl-C); returns how long the process took to exit."""
        assert self.process is not None
        began = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout)
        return time.monotonic() - began

"""What the conformance rules play on: a real `leasehold serve` in a temporary
directory, the worker under test as a process group of its own, and an owner's
JobService client.

The server is a subprocess (not in-process) so that a rule can drain it with
the same SIGTERM an operator sends, and restart it on the same database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import grpc
from google.protobuf import json_format, struct_pb2

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

# The shortest lease serve allows: lease tricks then take seconds, not minutes.
LEASE_SECONDS = 6.0
# Expired leases are looked for this often, so a frozen or killed worker's job
# comes back soon after its lease ends.
RESCUE_SECONDS = 0.5
# Long enough that a drain never cuts a conformance job short.
SHUTDOWN_GRACE_SECONDS = 30.0
OWNER = "conformance"
SERVER_START_SECONDS = 60.0
PROCESS_EXIT_SECONDS = 10.0
CALL_TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 0.05
TERMINAL = frozenset(
    {jobs_pb2.JOB_STATUS_SUCCEEDED, jobs_pb2.JOB_STATUS_FAILED, jobs_pb2.JOB_STATUS_CANCELLED}
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_token() -> str:
    return secrets.token_urlsafe(24)


class Server:
    """`leasehold serve` on SQLite in `directory`, header auth on loopback,
    `kind` routed to remote workers."""

    def __init__(self, directory: Path, kind: str, token: str) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._directory = directory
        self._kind = kind
        self._token = token
        self._process: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self._directory / "serve.log"

    async def start(self) -> None:
        """Start serve and return once it answers JobService."""
        database = self._directory / "conformance.db"
        self._log = self.log_path.open("ab")
        env = {key: value for key, value in os.environ.items() if not key.startswith("LEASEHOLD_")}
        env["LEASEHOLD_WORKER_TOKEN"] = self._token
        # serve's own flags, each given, so nothing in the caller's environment
        # (a LEASEHOLD_DATABASE_URL, say) reaches the server the rules play on.
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "leasehold",
            "serve",
            "--database-url",
            f"sqlite+aiosqlite:///{database}",
            "--listen",
            self.address,
            "--remote-kinds",
            self._kind,
            "--lease-seconds",
            f"{LEASE_SECONDS:g}",
            "--rescue-seconds",
            f"{RESCUE_SECONDS:g}",
            "--shutdown-grace",
            f"{SHUTDOWN_GRACE_SECONDS:g}",
            "--retention",
            "0",
            "--log-level",
            "warning",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=env,
        )
        async with Jobs(self.address) as jobs:
            deadline = time.monotonic() + SERVER_START_SECONDS
            while not await jobs.answers():
                if self._process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"leasehold serve did not start; see {self.log_path}")
                await asyncio.sleep(0.1)

    def drain(self) -> None:
        """SIGTERM: the server drains (waiting Claims answered empty, running
        attempts given their grace), then exits."""
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(signal.SIGTERM)

    async def exited(self, timeout: float) -> int | None:
        """The exit status once serve has exited, or None after `timeout`."""
        if self._process is None:
            return 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                return await self._process.wait()
        return None

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self.drain()
            if await self.exited(PROCESS_EXIT_SECONDS) is None:
                self._process.kill()
                await self._process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


class WorkerProcess:
    """The worker under test: COMMAND in a session (so a process group) of its
    own, so that a stop, a continue or a kill reaches a shell wrapper's
    children too."""

    def __init__(self, command: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self._command = list(command)
        self._env = env
        self.log_path = log_path
        self._process: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._env,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def signal(self, signum: int) -> None:
        """To the whole process group."""
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signum)

    async def exited(self, timeout: float) -> int | None:
        if self._process is None:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                return await self._process.wait()
        return None

    async def kill(self) -> None:
        """SIGKILL to the group; returns once the command has exited."""
        if self._process is None:
            return
        self.signal(signal.SIGCONT)  # a stopped group would not see its SIGKILL until continued
        self.signal(signal.SIGKILL)
        await self._process.wait()
        # The group's other members (a wrapper's children) go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.running:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            if await self.exited(PROCESS_EXIT_SECONDS) is None:
                await self.kill()
        elif self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""


class Jobs:
    """The owner's JobService, async."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = jobs_pb2_grpc.JobServiceStub(self._channel)
        self._metadata = (("x-owner-id", OWNER),)

    async def reconnect(self) -> None:
        """A new channel, after the server restarted: the old one's reconnect
        backoff would only add delay."""
        old, self._channel = self._channel, grpc.aio.insecure_channel(self._address)
        self._stub = jobs_pb2_grpc.JobServiceStub(self._channel)
        await old.close()

    async def __aenter__(self) -> Jobs:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close()

    async def answers(self) -> bool:
        try:
            await self._stub.GetStats(jobs_pb2.GetStatsRequest(), metadata=self._metadata, timeout=2)
        except grpc.aio.AioRpcError:
            return False
        return True

    async def enqueue(self, kind: str, payload: dict[str, object], max_attempts: int = 5) -> jobs_pb2.Job:
        request = jobs_pb2.EnqueueRequest(
            kind=kind,
            payload=json_format.ParseDict(payload, struct_pb2.Struct()),
            max_attempts=max_attempts,
            # A recovered lease or a failure comes back at once, not after the
            # default backoff, so the rules that lose an attempt stay short.
            retry_policy=jobs_pb2.RetryPolicy(initial_interval_seconds=0.1, backoff_coefficient=1),
        )
        response = await self._stub.Enqueue(request, metadata=self._metadata, timeout=CALL_TIMEOUT_SECONDS)
        return response.job

    async def get(self, job_id: str) -> jobs_pb2.Job:
        response = await self._stub.Get(
            jobs_pb2.GetRequest(job_id=job_id), metadata=self._metadata, timeout=CALL_TIMEOUT_SECONDS
        )
        return response.job

    async def cancel(self, job_id: str) -> jobs_pb2.Job:
        response = await self._stub.Cancel(
            jobs_pb2.CancelRequest(job_id=job_id), metadata=self._metadata, timeout=CALL_TIMEOUT_SECONDS
        )
        return response.job

    async def wait_for(
        self, job_id: str, found: Callable[[jobs_pb2.Job], bool], timeout: float
    ) -> tuple[jobs_pb2.Job, bool]:
        """Poll Get until `found(job)` or `timeout`; (the last job read, found)."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get(job_id)
            if found(job):
                return job, True
            if time.monotonic() > deadline:
                return job, False
            await asyncio.sleep(POLL_SECONDS)

    async def terminal(self, job_id: str, timeout: float) -> tuple[jobs_pb2.Job, bool]:
        return await self.wait_for(job_id, lambda job: job.status in TERMINAL, timeout)

"""Starting `leasehold serve` with remote kinds and `leasehold worker` processes
for the remote-worker experiments, and reading back what happened."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc

from leasehold.v1 import jobs_pb2, worker_pb2_grpc
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import TEST_HANDLERS, Leasehold, event_payload, wait_until

REMOTE_HANDLERS = "tests.remote.handlers"
TOKEN = secrets.token_urlsafe(24)
# Short leases so that a lapse takes seconds; the rescuer looks twice a second.
LEASE_SECONDS = "6"
RESCUE_SECONDS = "0.5"

Track = Callable[[Leasehold], Leasehold]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve(
    track: Track, database_url: str, records: Path, *extra: str, port: int = 0, start: bool = True
) -> Leasehold:
    """`leasehold serve` routing `remote.*` to remote workers (and running the
    test kinds itself), with the worker token set."""
    process = track(
        Leasehold(
            "serve",
            "--database-url",
            database_url,
            "--listen",
            f"127.0.0.1:{port}",
            "--remote-kinds",
            "remote.*",
            "--handlers",
            *TEST_HANDLERS,
            "--lease-seconds",
            LEASE_SECONDS,
            "--rescue-seconds",
            RESCUE_SECONDS,
            "--poll-seconds",
            "0.2",
            *extra,
            env={"LEASEHOLD_WORKER_TOKEN": TOKEN, RECORD_DIR_ENV: str(records)},
        )
    )
    if start:
        process.start()
    return process


def worker(track: Track, port: int, records: Path, *extra: str, token: str = TOKEN) -> Leasehold:
    """A `leasehold worker` process for the remote kinds, started (it has said
    `worker.started`)."""
    process = launch_worker(track, port, records, *extra, token=token)
    wait_started(process)
    return process


def launch_worker(track: Track, port: int, records: Path, *extra: str, token: str = TOKEN) -> Leasehold:
    process = track(
        Leasehold(
            "worker",
            "--server",
            f"127.0.0.1:{port}",
            "--handlers",
            REMOTE_HANDLERS,
            *extra,
            env={"LEASEHOLD_WORKER_TOKEN": token, RECORD_DIR_ENV: str(records)},
        )
    )
    return process.launch()


def wait_started(process: Leasehold) -> None:
    # Generous: tests launch up to eight workers at once, each an interpreter
    # importing its stack, on a machine that may be busy with other tests.
    wait_until(
        lambda: process.events("worker.started") or process.returncode is not None,
        120,
        "the worker to start",
    )
    assert process.returncode is None, process.output[-3000:]


def worker_stub(port: int, host: str = "127.0.0.1") -> tuple[grpc.Channel, worker_pb2_grpc.WorkerServiceStub]:
    channel = grpc.insecure_channel(f"{host}:{port}")
    return channel, worker_pb2_grpc.WorkerServiceStub(channel)


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def attempt_windows(log: Iterable[tuple[str, Mapping[str, Any]]]) -> list[tuple[int, str]]:
    """Each attempt of a job's log, given as (event type, payload) pairs, as
    (attempt, how it ended), checking that an attempt ends before the next one
    starts: a `job.started` while another attempt is open would mean two
    attempts overlapped."""
    ends = {
        "job.succeeded",
        "job.failed",
        "job.cancelled",
        "job.retry_scheduled",
        "job.lease_expired",
        "job.released",
        "job.snoozed",
    }
    windows: list[tuple[int, str]] = []
    open_attempt: int | None = None
    for event_type, payload in log:
        if event_type == "job.started":
            assert open_attempt is None, f"attempt {payload} began while {open_attempt} ran"
            open_attempt = int(payload["attempt"])
        elif event_type in ends and open_attempt is not None:
            windows.append((open_attempt, event_type))
            open_attempt = None
    return windows


def as_log(events: list[jobs_pb2.JobEvent]) -> list[tuple[str, dict[str, Any]]]:
    """WatchEvents' events as the (type, payload) pairs `attempt_windows` reads."""
    return [(event.type, event_payload(event)) for event in events]

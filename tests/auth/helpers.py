"""A real server in one auth mode on a real port, channels to it (plaintext or
TLS, with or without a client certificate), and the one call per service the
auth tests make."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from leasehold._server.app import LeaseholdApp
from leasehold._server.auth.settings import AuthSettings
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import (
    jobs_pb2,
    jobs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.credentials import Issued
from tests.support import sqlite_url, test_registry

REMOTE_KINDS = ("media.*", "report.x")
Metadata = tuple[tuple[str, str], ...]


@asynccontextmanager
async def serving(directory: Path, auth: AuthSettings, **settings: Any) -> AsyncIterator[LeaseholdApp]:
    settings.setdefault("listen", "127.0.0.1:0")
    app = LeaseholdApp(
        Settings(
            database_url=sqlite_url(directory, f"{auth.mode}.db"),
            runtime=RuntimeSettings(concurrency=2, lease_seconds=6, poll_seconds=0.05),
            remote_kinds=REMOTE_KINDS,
            auth=auth,
            **settings,
        ),
        clock=SystemClock(),
        registry=test_registry(),
    )
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace_seconds=0.5)


def connect(app: LeaseholdApp, *, ca: bytes | None = None, client: Issued | None = None) -> grpc.aio.Channel:
    """Plaintext without `ca`; TLS trusting `ca` (presenting `client`'s certificate) with it."""
    if ca is None:
        return grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=client.key if client else None,
        certificate_chain=client.cert if client else None,
    )
    return grpc.aio.secure_channel(f"localhost:{app.port}", credentials)


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def list_jobs(channel: grpc.aio.Channel, metadata: Metadata = ()) -> Awaitable[jobs_pb2.ListResponse]:
    return jobs_pb2_grpc.JobServiceStub(channel).List(jobs_pb2.ListRequest(), metadata=metadata)


def enqueue(channel: grpc.aio.Channel, metadata: Metadata, kind: str = "example.echo") -> Awaitable[Any]:
    return jobs_pb2_grpc.JobServiceStub(channel).Enqueue(
        jobs_pb2.EnqueueRequest(kind=kind), metadata=metadata
    )


def list_schedules(channel: grpc.aio.Channel, metadata: Metadata = ()) -> Awaitable[Any]:
    stub = schedules_pb2_grpc.ScheduleServiceStub(channel)
    return stub.ListSchedules(schedules_pb2.ListSchedulesRequest(), metadata=metadata)


def server_info(channel: grpc.aio.Channel, metadata: Metadata = ()) -> Awaitable[Any]:
    stub = worker_pb2_grpc.WorkerServiceStub(channel)
    return stub.GetServerInfo(worker_pb2.GetServerInfoRequest(), metadata=metadata)


def claim(channel: grpc.aio.Channel, metadata: Metadata, *kinds: str) -> Awaitable[worker_pb2.ClaimResponse]:
    stub = worker_pb2_grpc.WorkerServiceStub(channel)
    request = worker_pb2.ClaimRequest(worker_id="auth-test", kinds=kinds, wait_seconds=0)
    return stub.Claim(request, metadata=metadata)


RPCS = {"JobService": list_jobs, "ScheduleService": list_schedules, "WorkerService": server_info}


def case_ids(cases: list[tuple[Any, ...]]) -> list[str]:
    """`case-Service` for each row of an auth matrix."""
    return [f"{case[0]}-{case[2]}" for case in cases]

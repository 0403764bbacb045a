"""A real server with a token file granting an admin, two owners and a worker,
and the calls the AdminService tests make through the real channel."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from leasehold._server.app import LeaseholdApp
from leasehold._server.auth.settings import AuthSettings
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc, worker_pb2_grpc
from tests.auth.helpers import REMOTE_KINDS
from tests.credentials import bearer, token_file
from tests.support import test_registry

ROLES = ("admin", "owner:alice", "owner:bob", "worker")
Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Credentials:
    path: Path
    by_role: dict[str, Metadata]

    @property
    def admin(self) -> Metadata:
        return self.by_role["admin"]

    def owner(self, name: str) -> Metadata:
        return self.by_role[f"owner:{name}"]

    @property
    def worker(self) -> Metadata:
        return self.by_role["worker"]


def credentials(directory: Path) -> Credentials:
    path, tokens = token_file(directory / "tokens", *ROLES)
    return Credentials(path, {role: bearer(token) for role, token in zip(ROLES, tokens, strict=True)})


@asynccontextmanager
async def admin_server(
    database_url: str, creds: Credentials, concurrency: int = 2, lease_seconds: float = 6, **settings: Any
) -> AsyncIterator[LeaseholdApp]:
    """The whole service on `database_url`, --auth token with `creds`."""
    app = LeaseholdApp(
        Settings(
            database_url=database_url,
            listen="127.0.0.1:0",
            runtime=RuntimeSettings(concurrency=concurrency, lease_seconds=lease_seconds, poll_seconds=0.05),
            remote_kinds=REMOTE_KINDS,
            auth=AuthSettings(mode="token", token_file=str(creds.path)),
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


@dataclass
class Stubs:
    admin: admin_pb2_grpc.AdminServiceStub
    jobs: jobs_pb2_grpc.JobServiceStub
    worker: worker_pb2_grpc.WorkerServiceStub


@asynccontextmanager
async def stubs(app: LeaseholdApp) -> AsyncIterator[Stubs]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        yield Stubs(
            admin_pb2_grpc.AdminServiceStub(channel),
            jobs_pb2_grpc.JobServiceStub(channel),
            worker_pb2_grpc.WorkerServiceStub(channel),
        )


async def enqueue(s: Stubs, metadata: Metadata, kind: str = "media.resize", **fields: Any) -> str:
    response = await s.jobs.Enqueue(jobs_pb2.EnqueueRequest(kind=kind, **fields), metadata=metadata)
    return response.job.id


async def list_every(
    s: Stubs, metadata: Metadata, page_size: int, job_filter: admin_pb2.JobFilter | None = None
) -> list[jobs_pb2.Job]:
    """Every page of ListAllJobs, following the tokens."""
    found: list[jobs_pb2.Job] = []
    token = ""
    while True:
        page = await s.admin.ListAllJobs(
            admin_pb2.ListAllJobsRequest(page_size=page_size, page_token=token, filter=job_filter),
            metadata=metadata,
        )
        found.extend(page.jobs)
        token = page.next_page_token
        if not token:
            return found

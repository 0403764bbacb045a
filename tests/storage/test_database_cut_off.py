"""PostgreSQL cut off from a serving replica, by a proxy between the two
(`tests.pg_proxy.PostgresProxy`).

- A COMMIT whose answer never arrives: PostgreSQL commits, and the connection
  breaks before its answer reaches the writer. The Enqueue that rode in the
  batch must not hear OK (nobody knows it committed) nor "aborted" (it did
  commit): UNAVAILABLE, reason COMMIT_OUTCOME_UNKNOWN. Sent again with the same
  request_id it returns the job that landed, and only one exists.
- No database at all: calls get UNAVAILABLE saying to retry, health reads
  NOT_SERVING so a load balancer moves callers away, one log line says so; once
  the database is back the replica finds it by itself (nobody calls meanwhile)
  and health reads SERVING again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import error_reason
from tests.conftest import Postgres
from tests.database_reads import scalar
from tests.pg_proxy import PostgresProxy
from tests.support import owner_metadata, test_registry

# Routed to remote workers, which these tests have none of: nothing runs the
# job, so an Enqueue's batch is the only one that announces work.
KIND = "remote.cut"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Proxied:
    proxy: PostgresProxy
    direct_url: str  # the same database, not through the proxy
    jobs: jobs_pb2_grpc.JobServiceStub
    health: health_pb2_grpc.HealthStub


@pytest.fixture
async def proxied(postgres: Postgres) -> AsyncIterator[Proxied]:
    direct = postgres.fresh_database_url()
    url = make_url(direct)
    assert url.host is not None and url.port is not None
    async with PostgresProxy(url.host, url.port).running() as proxy:
        settings = Settings(
            database_url=url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False),
            listen="127.0.0.1:0",
            runtime=RuntimeSettings(concurrency=1, lease_seconds=6, poll_seconds=5),
            remote_kinds=("remote.*",),
        )
        app = LeaseholdApp(settings, clock=SystemClock(), registry=test_registry())
        await app.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
                yield Proxied(
                    proxy, direct, jobs_pb2_grpc.JobServiceStub(channel), health_pb2_grpc.HealthStub(channel)
                )
        finally:
            await app.stop(grace_seconds=0.5)


async def _health(proxied: Proxied) -> int:
    response = await proxied.health.Check(health_pb2.HealthCheckRequest(service=""))
    return response.status


async def _until_health(proxied: Proxied, status: int, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while await _health(proxied) != status:
            await asyncio.sleep(0.05)


async def test_an_enqueue_whose_commit_answer_is_lost_hears_unknown_and_its_retry_lands_once(
    proxied: Proxied,
) -> None:
    request = jobs_pb2.EnqueueRequest(kind=KIND, request_id="order-17")
    proxied.proxy.cut_next_commit()
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await proxied.jobs.Enqueue(request, metadata=owner_metadata())
    assert proxied.proxy.cut == 1  # the server did answer COMMIT; the writer never heard it
    assert lost.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error_reason(lost.value) == "COMMIT_OUTCOME_UNKNOWN"
    assert "may or may not have been applied" in (lost.value.details() or "")

    # It did commit, and the retry the message asks for finds it.
    landed = scalar(proxied.direct_url, "SELECT id FROM jobs WHERE kind = :kind", kind=KIND)
    again = await proxied.jobs.Enqueue(request, metadata=owner_metadata())
    assert again.job.id == landed
    assert scalar(proxied.direct_url, "SELECT count(*) FROM jobs") == 1
    # The writer reconnected by itself: the next write is answered.
    other = await proxied.jobs.Enqueue(jobs_pb2.EnqueueRequest(kind=KIND), metadata=owner_metadata())
    assert other.job.id != landed


async def test_with_no_database_health_is_not_serving_until_it_is_back(proxied: Proxied) -> None:
    assert await _health(proxied) == SERVING
    with capture_logs() as logs:
        proxied.proxy.sever()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await proxied.jobs.Enqueue(jobs_pb2.EnqueueRequest(kind=KIND), metadata=owner_metadata())
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "retry" in (refused.value.details() or "")
        await _until_health(proxied, NOT_SERVING, timeout=10)

        # Back, with nobody calling: the replica finds it by itself.
        proxied.proxy.heal()
        await _until_health(proxied, SERVING, timeout=15)
    done = await proxied.jobs.Enqueue(jobs_pb2.EnqueueRequest(kind=KIND), metadata=owner_metadata())
    assert scalar(proxied.direct_url, "SELECT count(*) FROM jobs WHERE id = :id", id=done.job.id) == 1
    switches = [record["event"] for record in logs if record["event"].startswith("storage.")]
    assert switches.count("storage.unreachable") == 1 and switches.count("storage.reachable") == 1

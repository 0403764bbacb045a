"""A COMMIT whose answer never arrives is answered as unknown, never guessed.

PostgreSQL commits; the connection breaks before its answer reaches the writer
(`tests.pg_proxy.CommitCutter` drops exactly that answer). The Enqueue that
rode in the batch must not hear OK (nobody knows it committed) nor "aborted"
(it did commit): UNAVAILABLE, reason COMMIT_OUTCOME_UNKNOWN. Sent again with
the same request_id it returns the job that landed, and only one exists.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from sqlalchemy.engine import make_url

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import SystemClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import error_reason
from tests.conftest import Postgres
from tests.database_reads import scalar
from tests.pg_proxy import CommitCutter
from tests.support import owner_metadata, test_registry

# Routed to remote workers, which this test has none of: nothing runs the job,
# so the Enqueue's batch is the only one that announces work.
KIND = "remote.cut"


@pytest.fixture
async def cutter(postgres: Postgres) -> AsyncIterator[tuple[CommitCutter, str]]:
    direct = postgres.fresh_database_url()
    url = make_url(direct)
    assert url.host is not None and url.port is not None
    async with CommitCutter(url.host, url.port).running() as proxy:
        yield proxy, direct


async def test_an_enqueue_whose_commit_answer_is_lost_hears_unknown_and_its_retry_lands_once(
    cutter: tuple[CommitCutter, str],
) -> None:
    proxy, direct = cutter
    proxied = make_url(direct).set(host="127.0.0.1", port=proxy.port)
    settings = Settings(
        database_url=proxied.render_as_string(hide_password=False),
        listen="127.0.0.1:0",
        runtime=RuntimeSettings(concurrency=1, lease_seconds=6, poll_seconds=5),
        remote_kinds=("remote.*",),
    )
    app = LeaseholdApp(settings, clock=SystemClock(), registry=test_registry())
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            request = jobs_pb2.EnqueueRequest(kind=KIND, request_id="order-17")
            proxy.cut_next_commit()
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await stub.Enqueue(request, metadata=owner_metadata())
            assert proxy.cut == 1  # the server did answer COMMIT; the writer never heard it
            assert lost.value.code() is grpc.StatusCode.UNAVAILABLE
            assert error_reason(lost.value) == "COMMIT_OUTCOME_UNKNOWN"
            assert "may or may not have been applied" in (lost.value.details() or "")

            # It did commit, and the retry the message asks for finds it.
            landed = scalar(direct, "SELECT id FROM jobs WHERE kind = :kind", kind=KIND)
            again = await stub.Enqueue(request, metadata=owner_metadata())
            assert again.job.id == landed
            assert scalar(direct, "SELECT count(*) FROM jobs") == 1
            # The writer reconnected by itself: the next write is answered.
            other = await stub.Enqueue(jobs_pb2.EnqueueRequest(kind=KIND), metadata=owner_metadata())
            assert other.job.id != landed
    finally:
        await app.stop(grace_seconds=0.5)

"""A cancel reaches a worker long-polling on another replica (protocol 2's
held leases), on PostgreSQL: the job is cancelled through replica A while the
worker that holds it waits in a Claim on replica B, whose long poll hears of it
through LISTEN/NOTIFY and answers at once with the news, long before the
Claim's wait or the worker's next heartbeat."""

from __future__ import annotations

import secrets

import grpc
import pytest

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.conftest import Postgres
from tests.replicas.support import Track, start_replicas
from tests.support import OWNER, owner_metadata
from tests.system.helpers import wait_until

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(24)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
KIND = "remote.work"


def test_a_cancel_on_one_replica_ends_a_claim_waiting_on_another(
    postgres: Postgres, processes: Track
) -> None:
    url = postgres.fresh_database_url()
    a, b = start_replicas(
        processes,
        url,
        2,
        *("--remote-kinds", "remote.*", "--log-level", "debug"),
        env={"LEASEHOLD_WORKER_TOKEN": TOKEN},
    )
    on_a, on_b = (grpc.insecure_channel(f"127.0.0.1:{replica.port}") for replica in (a, b))
    with on_a, on_b:
        jobs_a = jobs_pb2_grpc.JobServiceStub(on_a)
        enqueue = jobs_pb2.EnqueueRequest(kind=KIND)
        job = jobs_a.Enqueue(enqueue, metadata=owner_metadata(OWNER), timeout=30).job
        claim = worker_pb2.ClaimRequest(worker_id="w", kinds=[KIND], wait_seconds=10)
        (claimed,) = worker_pb2_grpc.WorkerServiceStub(on_a).Claim(claim, metadata=AUTH, timeout=30).jobs
        held = worker_pb2.LeaseRef(job_id=job.id, lease_token=claimed.lease_token)

        waits_before = len(b.events("worker.claim_waiting"))
        waiting = worker_pb2_grpc.WorkerServiceStub(on_b).Claim.future(
            worker_pb2.ClaimRequest(worker_id="w", kinds=[KIND], wait_seconds=60, held_leases=[held]),
            metadata=AUTH,
            timeout=45,  # below its wait: only the news can end it in time
        )
        wait_until(lambda: len(b.events("worker.claim_waiting")) > waits_before, 30, "the claim to wait on B")

        jobs_a.Cancel(jobs_pb2.CancelRequest(job_id=job.id), metadata=owner_metadata(OWNER), timeout=30)

        answer = waiting.result()
    assert list(answer.jobs) == []
    assert [(s.job_id, s.cancel_requested, s.lost) for s in answer.held] == [(job.id, True, False)]

"""PauseKind on one replica holds on every replica of the same PostgreSQL
database: replica B's remote workers stop getting the kind while other kinds
go on, B's Get says WAIT_REASON_PAUSED, and ResumeKind on A wakes a Claim
already waiting on B."""

from __future__ import annotations

import asyncio
from pathlib import Path

from leasehold.v1 import admin_pb2, jobs_pb2, worker_pb2
from tests.admin.helpers import admin_server, credentials, enqueue, stubs
from tests.conftest import Postgres


async def test_a_pause_on_one_replica_holds_on_the_other(postgres: Postgres, tmp_path: Path) -> None:
    creds = credentials(tmp_path)
    url = postgres.fresh_database_url()
    async with (
        admin_server(url, creds) as replica_a,
        admin_server(url, creds) as replica_b,
        stubs(replica_a) as a,
        stubs(replica_b) as b,
    ):
        paused = await a.admin.PauseKind(
            admin_pb2.PauseKindRequest(kind="media.resize"), metadata=creds.admin
        )
        assert paused.paused
        held = await enqueue(b, creds.owner("alice"), "media.resize")
        other = await enqueue(b, creds.owner("alice"), "report.x")

        both = worker_pb2.ClaimRequest(worker_id="b-1", kinds=["media.resize", "report.x"], max_jobs=2)
        claimed = await b.worker.Claim(both, metadata=creds.worker)
        assert [c.job.id for c in claimed.jobs] == [other]  # the older paused job was passed over
        got = await b.jobs.Get(jobs_pb2.GetRequest(job_id=held), metadata=creds.owner("alice"))
        assert (got.job.status, got.job.wait_reason) == (
            jobs_pb2.JOB_STATUS_QUEUED,
            jobs_pb2.WAIT_REASON_PAUSED,
        )
        stats = await b.admin.GetQueueStats(admin_pb2.GetQueueStatsRequest(), metadata=creds.admin)
        assert [(k.kind, k.queued, k.paused) for k in stats.kinds] == [
            ("media.resize", 1, True),
            ("report.x", 0, False),
        ]

        # A Claim waiting on B for the paused kind is answered by the resume on A.
        waiting_claim = worker_pb2.ClaimRequest(worker_id="b-2", kinds=["media.resize"], wait_seconds=30)
        waiting = asyncio.ensure_future(b.worker.Claim(waiting_claim, metadata=creds.worker))
        nothing_yet = await b.worker.Claim(
            worker_pb2.ClaimRequest(worker_id="b-3", kinds=["media.resize"]), metadata=creds.worker
        )
        assert list(nothing_yet.jobs) == []
        resumed = await a.admin.ResumeKind(
            admin_pb2.ResumeKindRequest(kind="media.resize"), metadata=creds.admin
        )
        assert not resumed.paused
        woken = await asyncio.wait_for(waiting, 25)
        assert [c.job.id for c in woken.jobs] == [held]

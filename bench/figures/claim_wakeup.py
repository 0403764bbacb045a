"""Claim wake-up: how soon a remote worker's waiting long poll returns with a job just enqueued.

A remote worker spends its idle time inside `WorkerService.Claim`, a long poll; this figure is
the price of that design for one job arriving on an idle queue, the remote counterpart of
trickle's enqueue->start latency.

`serve` runs with `--remote-kinds bench.remote` (a kind with no handler anywhere, so only a
WorkerService client can take it). Two client processes, so neither's event loop or GIL delays
the other's stamps:

* the claimer (`claim_loop`) keeps one `Claim` (max_jobs=1, wait_seconds 30) waiting, stamps
  `time.monotonic()` the moment it returns with a job, Completes that job (untimed) and tells the
  enqueuer through a FIFO that it is about to poll again;
* the enqueuer (`enqueue_one_at_a_time`) reads that byte, sleeps a short gap (20 ms, jittered:
  long enough for the next Claim to be parked in the server's wait, so every job meets a waiting
  poll rather than a poll that would find it anyway), then sends one Enqueue, stamping just
  before the send and just after the answer.

The figure is claim return minus the Enqueue's answer, i.e. from the moment the job is known to
be committed to the moment a worker holds it: the server's wake-up, its claim transaction and the
Claim response. With one replica the waiting Claim is served inside the Enqueue's own commit, so
the two answers race back and the Claim's may arrive first: that one counts as 0. The stamp
before the send is reported beside it (`from_send_*` in params: that adds the Enqueue call's own
commit). CLOCK_MONOTONIC is one clock for the whole machine on Linux, so the two processes'
stamps compare. The first `warmups` jobs (connections and code paths warming) are not counted;
then `count` jobs, strictly one at a time; p50/p95/p99.

The same measurement runs on a fresh PostgreSQL database of the run's cluster (group
`pg_claim_wakeup`), where that commit is a durable PostgreSQL one (one replica: the wake-up
itself stays inside the server process).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from bench.common import METADATA, BenchError, Measurement, latency_summary
from bench.context import RoundContext, RoundItem
from bench.load import CONNECT_TIMEOUT, ENQUEUE_METHOD, enqueue_request
from bench.procs import WORKER_TOKEN, Child, leasehold_server
from leasehold.v1 import jobs_pb2, worker_pb2, worker_pb2_grpc

KIND = "bench.remote"
WORKER_ID = "bench-claimer"
CALL_TIMEOUT = 60.0


def _channel(target: str) -> grpc.Channel:
    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
    return channel


def claim_loop(target: str, count: int, warmups: int, fifo: str, wait_seconds: float) -> list[Any]:
    """Run in a child process: claim `warmups + count` jobs one at a time, each with a fresh long
    poll, and return [job id, monotonic stamp of the Claim's return] for the counted ones. Sync
    gRPC on purpose: the stamp is taken on the same thread the moment the call returns."""
    metadata = (("authorization", f"Bearer {WORKER_TOKEN}"),)
    claims: list[Any] = []
    with _channel(target) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        request = worker_pb2.ClaimRequest(
            worker_id=WORKER_ID, kinds=[KIND], max_jobs=1, wait_seconds=wait_seconds
        )
        # Opening a FIFO for writing waits for its reader: the enqueuer is up once this returns.
        with open(fifo, "wb", buffering=0) as ready:
            for i in range(warmups + count):
                response = stub.Claim(request, metadata=metadata, timeout=wait_seconds + CALL_TIMEOUT)
                at = time.monotonic()
                if len(response.jobs) != 1:
                    raise BenchError(f"claim {i}: came back with {len(response.jobs)} jobs")
                claimed = response.jobs[0]
                stub.Complete(
                    worker_pb2.CompleteRequest(job_id=claimed.job.id, lease_token=claimed.lease_token),
                    metadata=metadata,
                    timeout=CALL_TIMEOUT,
                )
                if i >= warmups:
                    claims.append([claimed.job.id, at])
                ready.write(b".")
    return claims


def enqueue_one_at_a_time(target: str, count: int, warmups: int, fifo: str, gap: float) -> list[Any]:
    """Run in a child process: enqueue `warmups + count` jobs of KIND, each once the claimer has
    finished the previous one and a jittered `gap` later. Returns [job id, stamp before the
    send, stamp after the answer] for the counted ones."""
    request = enqueue_request(KIND)
    sent: list[Any] = []
    with _channel(target) as channel:
        call = channel.unary_unary(ENQUEUE_METHOD)
        with open(fifo, "rb", buffering=0) as ready:
            for i in range(warmups + count):
                time.sleep(gap * random.uniform(0.8, 1.2))
                before = time.monotonic()
                raw = call(request, metadata=METADATA, timeout=CALL_TIMEOUT)
                after = time.monotonic()
                job_id = jobs_pb2.EnqueueResponse.FromString(raw).job.id
                if i >= warmups:
                    sent.append([job_id, before, after])
                if ready.read(1) != b".":
                    raise BenchError(f"enqueue {i}: the claimer went away")
    return sent


def measure(ctx: RoundContext, database: Path | str, prefix: str) -> list[Measurement]:
    """`database`: a SQLite file or a database URL; the server creates the schema at start-up."""
    sizes = ctx.sizes
    count, warmups = sizes.claim_wakeup_count, sizes.claim_wakeup_warmups
    name = prefix.replace("leasehold.", "").replace(".", "-")
    fifo = ctx.directory / f"{name}.fifo"
    os.mkfifo(fifo)
    timeout = (warmups + count) * (sizes.claim_wakeup_gap + 1.0) + 60
    with leasehold_server(ctx.directory, database, 2, remote_kinds=(KIND,), name=name) as server:
        common = {"target": server.target, "count": count, "warmups": warmups, "fifo": str(fifo)}
        with (
            Child(
                ctx.directory,
                f"{name}-claimer",
                "bench.figures.claim_wakeup:claim_loop",
                {**common, "wait_seconds": sizes.claim_wakeup_wait_seconds},
            ) as claimer,
            Child(
                ctx.directory,
                f"{name}-enqueuer",
                "bench.figures.claim_wakeup:enqueue_one_at_a_time",
                {**common, "gap": sizes.claim_wakeup_gap},
            ) as enqueuer,
        ):
            sent = enqueuer.result(timeout)
            claims = {job_id: at for job_id, at in claimer.result(60)}
        server.alive()
    if [job_id for job_id, _, _ in sent] != list(claims):
        raise BenchError("claim wake-up: the jobs claimed are not the jobs enqueued, in order")
    # A Claim answered before the Enqueue waited no time after the commit was known (params
    # count how many were).
    from_commit = latency_summary(max(0.0, claims[job_id] - after) for job_id, _, after in sent)
    from_send = latency_summary(claims[job_id] - before for job_id, before, _ in sent)
    enqueue_rpc = latency_summary(after - before for _, before, after in sent)
    params = {
        "jobs": count,
        "warmups": warmups,
        "gap_ms": sizes.claim_wakeup_gap * 1000,
        "wait_seconds": sizes.claim_wakeup_wait_seconds,
        "measured_from": "Enqueue answered (committed)",
        "max_ms": round(from_commit["max"], 3),
        "claims_before_enqueue_answer": sum(1 for job_id, _, after in sent if claims[job_id] < after),
        "from_send_p50_ms": round(from_send["p50"], 3),
        "from_send_p99_ms": round(from_send["p99"], 3),
        "enqueue_rpc_p50_ms": round(enqueue_rpc["p50"], 3),
    }
    return [
        Measurement(f"{prefix}.{p}", from_commit[p], "ms", "leasehold", params) for p in ("p50", "p95", "p99")
    ]


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    yield from measure(ctx, ctx.directory / "claim-wakeup.db", "leasehold.claim_wakeup")


def run_postgres(ctx: RoundContext) -> Iterator[RoundItem]:
    database = ctx.postgres.database("claim_wakeup")
    yield from measure(ctx, database.url, "leasehold.pg.claim_wakeup")

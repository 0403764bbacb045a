"""Cancel push: how soon a remote worker hears of a cancel of a job it is running.

A remote worker that has free slots spends its time in a waiting `Claim`, naming in
`held_leases` the attempts it runs; a cancel of one of them ends that wait with the news.
This is the time from the cancel being known to the server (its `Cancel` answered) to the
worker holding the news: what a handler's abort signal waits for. Without the push it would be
up to a heartbeat interval (a third of the lease: 10 s at the defaults).

`serve` runs with `--remote-kinds bench.remote`. Two client processes, as in claim_wakeup:

* the holder (`hold_loop`) claims the job the canceller enqueued (untimed), then sends a `Claim`
  with that lease in `held_leases` (wait_seconds 30), tells the canceller through a FIFO that it
  is about to wait, stamps `time.monotonic()` the moment that Claim returns with the news, and
  confirms the cancel (untimed);
* the canceller (`cancel_one_at_a_time`) enqueues a job, waits for the holder's byte, sleeps a
  short jittered gap (so that the Claim is parked in the server's wait), sends `Cancel`,
  stamping just before the send and just after the answer.

The figure is the Claim's return minus the Cancel's answer (0 when the news raced ahead of the
answer); the first `warmups` are not counted; p50/p95/p99.
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
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc

KIND = "bench.remote"
WORKER_ID = "bench-holder"
CALL_TIMEOUT = 60.0
WAIT_SECONDS = 30.0


def _channel(target: str) -> grpc.Channel:
    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
    return channel


def hold_loop(target: str, count: int, warmups: int, fifo: str) -> list[Any]:
    """Run in a child process: for each job, claim it, wait for news of it, confirm the cancel.
    Returns [job id, monotonic stamp of the news] for the counted ones."""
    metadata = (("authorization", f"Bearer {WORKER_TOKEN}"),)
    news: list[Any] = []
    with _channel(target) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        claim = worker_pb2.ClaimRequest(worker_id=WORKER_ID, kinds=[KIND], wait_seconds=WAIT_SECONDS)
        with open(fifo, "wb", buffering=0) as ready:
            for i in range(warmups + count):
                response = stub.Claim(claim, metadata=metadata, timeout=WAIT_SECONDS + CALL_TIMEOUT)
                if len(response.jobs) != 1:
                    raise BenchError(f"hold {i}: the claim came back with {len(response.jobs)} jobs")
                claimed = response.jobs[0]
                held = worker_pb2.LeaseRef(job_id=claimed.job.id, lease_token=claimed.lease_token)
                waiting = worker_pb2.ClaimRequest(
                    worker_id=WORKER_ID, kinds=[KIND], wait_seconds=WAIT_SECONDS, held_leases=[held]
                )
                future = stub.Claim.future(waiting, metadata=metadata, timeout=WAIT_SECONDS + CALL_TIMEOUT)
                ready.write(b".")
                answer = future.result()
                at = time.monotonic()
                if [(s.job_id, s.cancel_requested) for s in answer.held] != [(claimed.job.id, True)]:
                    raise BenchError(f"hold {i}: the wait ended without the cancel's news: {answer}")
                stub.ConfirmCancel(
                    worker_pb2.ConfirmCancelRequest(job_id=claimed.job.id, lease_token=claimed.lease_token),
                    metadata=metadata,
                    timeout=CALL_TIMEOUT,
                )
                if i >= warmups:
                    news.append([claimed.job.id, at])
    return news


def cancel_one_at_a_time(target: str, count: int, warmups: int, fifo: str, gap: float) -> list[Any]:
    """Run in a child process: enqueue a job, and once the holder waits on it, cancel it.
    Returns [job id, stamp before the Cancel, stamp after its answer] for the counted ones."""
    sent: list[Any] = []
    with _channel(target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        enqueue = channel.unary_unary(ENQUEUE_METHOD)
        request = enqueue_request(KIND)
        with open(fifo, "rb", buffering=0) as ready:
            for i in range(warmups + count):
                raw = enqueue(request, metadata=METADATA, timeout=CALL_TIMEOUT)
                job = jobs_pb2.EnqueueResponse.FromString(raw).job
                if ready.read(1) != b".":
                    raise BenchError(f"cancel {i}: the holder went away")
                time.sleep(gap * random.uniform(0.8, 1.2))
                before = time.monotonic()
                stub.Cancel(jobs_pb2.CancelRequest(job_id=job.id), metadata=METADATA, timeout=CALL_TIMEOUT)
                after = time.monotonic()
                if i >= warmups:
                    sent.append([job.id, before, after])
    return sent


def measure(ctx: RoundContext, database: Path | str, prefix: str) -> list[Measurement]:
    sizes = ctx.sizes
    count, warmups, gap = sizes.claim_wakeup_count, sizes.claim_wakeup_warmups, sizes.claim_wakeup_gap
    name = prefix.replace("leasehold.", "").replace(".", "-")
    fifo = ctx.directory / f"{name}.fifo"
    os.mkfifo(fifo)
    timeout = (warmups + count) * (gap + 1.0) + 60
    with leasehold_server(ctx.directory, database, 2, remote_kinds=(KIND,), name=name) as server:
        common = {"target": server.target, "count": count, "warmups": warmups, "fifo": str(fifo)}
        with (
            Child(ctx.directory, f"{name}-holder", "bench.figures.cancel_push:hold_loop", common) as holder,
            Child(
                ctx.directory,
                f"{name}-canceller",
                "bench.figures.cancel_push:cancel_one_at_a_time",
                {**common, "gap": gap},
            ) as canceller,
        ):
            sent = canceller.result(timeout)
            news = {job_id: at for job_id, at in holder.result(60)}
        server.alive()
    if [job_id for job_id, _, _ in sent] != list(news):
        raise BenchError("cancel push: the news heard is not of the jobs cancelled, in order")
    from_answer = latency_summary(max(0.0, news[job_id] - after) for job_id, _, after in sent)
    from_send = latency_summary(news[job_id] - before for job_id, before, _ in sent)
    params = {
        "jobs": count,
        "warmups": warmups,
        "gap_ms": gap * 1000,
        "measured_from": "Cancel answered (committed)",
        "max_ms": round(from_answer["max"], 3),
        "from_send_p50_ms": round(from_send["p50"], 3),
        "from_send_p99_ms": round(from_send["p99"], 3),
    }
    return [
        Measurement(f"{prefix}.{p}", from_answer[p], "ms", "leasehold", params) for p in ("p50", "p95", "p99")
    ]


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    yield from measure(ctx, ctx.directory / "cancel-push.db", "leasehold.cancel_push")

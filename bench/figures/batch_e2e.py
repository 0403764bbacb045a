"""End to end through BatchEnqueue: jobs/s from the first BatchEnqueue to the last `succeeded`,
with several clients enqueueing 100 jobs a call while one `serve` drains.

One `serve` process at its defaults (no `--concurrency`: the figure is the service as shipped) on
an empty database; `batch_e2e_clients` client processes each run bench.load.fixed_count over
BatchEnqueue, one call in flight, `batch_e2e_batch` no-op `bench.noop` jobs a call, until
`batch_e2e_jobs` jobs are enqueued between them. It is measured exactly as (c) e2e is: the start
is the earliest client's wall clock just before its first call, the end is the largest
`completed_at` in the database (the server's wall clock, same machine), read once all jobs are
`succeeded`. The target divides it by huey's drain in the same round, as e2e's does: the same
work, with the per-call cost of Enqueue amortised over a batch.
"""

from __future__ import annotations

from collections.abc import Iterator

from bench.common import BenchError, Measurement, succeeded_jobs, wait_until
from bench.context import RoundContext, RoundItem
from bench.load import enqueue_request
from bench.procs import Child, leasehold_server
from leasehold.v1 import jobs_pb2

BATCH_ENQUEUE_METHOD = "/leasehold.v1.JobService/BatchEnqueue"
DRAIN_TIMEOUT = 600.0


def batch_request(kind: str, size: int) -> bytes:
    """A serialized BatchEnqueueRequest of `size` identical items without a resource id (every
    item creates a job)."""
    item = jobs_pb2.EnqueueRequest.FromString(enqueue_request(kind))
    return jobs_pb2.BatchEnqueueRequest(requests=[item] * size).SerializeToString()


def calls_per_client(total: int, batch: int, clients: int) -> list[int]:
    """How many BatchEnqueue calls each client makes so that together they enqueue `total` jobs;
    a client left with none is not started."""
    if total % batch:
        raise BenchError(f"batch_e2e: {total} jobs are not a whole number of batches of {batch}")
    calls = total // batch
    shares = [calls // clients + (1 if i < calls % clients else 0) for i in range(clients)]
    return [share for share in shares if share]


def measure(ctx: RoundContext) -> Measurement:
    sizes = ctx.sizes
    total, batch = sizes.batch_e2e_jobs, sizes.batch_e2e_batch
    shares = calls_per_client(total, batch, sizes.batch_e2e_clients)
    database = ctx.directory / "batch_e2e.db"
    request_hex = batch_request("bench.noop", batch).hex()
    with leasehold_server(ctx.directory, database, None) as server:
        clients = [
            Child(
                ctx.directory,
                f"batch-e2e-client{i}",
                "bench.load:fixed_count",
                {
                    "target": server.target,
                    "method": BATCH_ENQUEUE_METHOD,
                    "request_hex": request_hex,
                    "concurrency": 1,
                    "total": calls,
                },
            )
            for i, calls in enumerate(shares)
        ]
        try:
            loads = [client.result(DRAIN_TIMEOUT) for client in clients]
        finally:
            for client in clients:
                client.kill()
        wait_until(
            lambda: server.alive() and succeeded_jobs(database)[0] >= total,
            DRAIN_TIMEOUT,
            "every batch_e2e job to succeed",
            0.1,
        )
    count, last = succeeded_jobs(database)
    if count != total or last is None:
        raise BenchError(f"batch_e2e: {count} of {total} jobs succeeded")
    first_send = min(float(load["first_send_wall"]) for load in loads)
    last_ack = max(float(load["last_ack_wall"]) for load in loads)
    seconds = last / 1e6 - first_send
    params = {
        "jobs": total,
        "batch": batch,
        "clients": len(shares),
        "server_concurrency": "default",
        "seconds": round(seconds, 3),
        "enqueue_rate": round(total / (last_ack - first_send), 1),
    }
    return Measurement("leasehold.batch_e2e", total / seconds, "jobs/s", "leasehold", params)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    yield measure(ctx)

"""Shutdown: how soon `serve` exits after the signal (DESIGN §13, the README's drain list).

The drain promises two figures: an idle server stops at once, whatever its grace; a busy one
exits within the grace plus about a second. The test suite checks that each exit happens, and
in which order, with bounds loose enough for a loaded CI machine; this group measures the real
figures on a quiet one.

* `leasehold.shutdown.idle`: `serve` at the production default grace (20 s), nothing running,
  then SIGINT; milliseconds from the signal to the process's exit.
* `leasehold.shutdown.beyond_grace`: `serve --concurrency 1` with a `shutdown_grace_seconds`
  grace and one `bench.hold` job running (it never returns, so the grace runs out and the job is
  handed back), then SIGTERM; milliseconds from the signal to the exit, less the grace.

Each is the median of `shutdown_samples` fresh servers on fresh databases (a server exits once);
the slowest sample is in params.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import grpc

from bench.common import METADATA, BenchError, Measurement, median, wait_until
from bench.context import RoundContext, RoundItem
from bench.load import CALL_TIMEOUT, CONNECT_TIMEOUT, ENQUEUE_METHOD, enqueue_request
from bench.procs import ServerProcess, leasehold_server
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

HOLD = "bench.hold"
PRODUCTION_GRACE = "20"  # serve's default (server.config.DEFAULT_SHUTDOWN_GRACE_SECONDS)
EXIT_TIMEOUT = 60.0  # far beyond either figure: a server still running then is a crash


def _exit_seconds(server: ServerProcess, signum: int) -> float:
    """Send `signum` and wait for the process to exit 0; the seconds that took."""
    began = time.monotonic()
    server.process.send_signal(signum)
    code = server.process.wait(EXIT_TIMEOUT)
    took = time.monotonic() - began
    if code != 0:
        raise BenchError(f"{server.name} exited with status {code} after signal {signum}")
    return took


def _hold_one_job(target: str) -> None:
    """Enqueue one `bench.hold` job and wait until it runs, so the drain has a handler to wait for."""
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
        raw = channel.unary_unary(ENQUEUE_METHOD)(
            enqueue_request(HOLD), metadata=METADATA, timeout=CALL_TIMEOUT
        )
        job_id = jobs_pb2.EnqueueResponse.FromString(raw).job.id
        stub = jobs_pb2_grpc.JobServiceStub(channel)

        def running() -> bool:
            request = jobs_pb2.GetRequest(job_id=job_id)
            job = stub.Get(request, metadata=METADATA, timeout=CALL_TIMEOUT).job
            return job.status == jobs_pb2.JOB_STATUS_RUNNING

        wait_until(running, 60.0, "the bench.hold job to start")


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    samples = ctx.sizes.shutdown_samples
    grace = ctx.sizes.shutdown_grace_seconds
    idle: list[float] = []
    beyond: list[float] = []
    for n in range(samples):
        with leasehold_server(
            ctx.directory,
            ctx.directory / f"idle-{n}.db",
            1,
            env={"LEASEHOLD_SHUTDOWN_GRACE": PRODUCTION_GRACE},
            name=f"idle-{n}",
        ) as server:
            idle.append(_exit_seconds(server, signal.SIGINT))
        with leasehold_server(
            ctx.directory,
            ctx.directory / f"busy-{n}.db",
            1,
            env={"LEASEHOLD_SHUTDOWN_GRACE": f"{grace:g}"},
            name=f"busy-{n}",
        ) as server:
            _hold_one_job(server.target)
            beyond.append(_exit_seconds(server, signal.SIGTERM) - grace)
    yield Measurement(
        "leasehold.shutdown.idle",
        median(idle) * 1000,
        "ms",
        "leasehold",
        {"samples": samples, "grace_s": float(PRODUCTION_GRACE), "max_ms": round(max(idle) * 1000, 1)},
    )
    yield Measurement(
        "leasehold.shutdown.beyond_grace",
        # A drain that beat its grace would be a bug the tests catch; here it would read as 0.
        max(0.0, median(beyond)) * 1000,
        "ms",
        "leasehold",
        {"samples": samples, "grace_s": grace, "max_ms": round(max(beyond) * 1000, 1)},
    )

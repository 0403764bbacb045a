"""A worker written against the raw `leasehold.v1` stubs, no SDK: the reference
the conformance rules are checked against.

    LEASEHOLD_SERVER=... LEASEHOLD_WORKER_TOKEN=... LEASEHOLD_KIND=... python -m tests.conformance.raw_worker

It runs the conformance handler contract (docs/protocol.md, Conformance) the way
the wire guide says. RAW_WORKER_BREAK=<rule> breaks exactly the one behaviour
that rule checks, so the tests can show each rule catches its mistake:

- round_trip: completes with an empty result Struct (the proto-loader trap);
- little_lease_left: renews a job an interval after it arrives, whatever lease it has;
- cancel_mid_run: names no held leases on Claim; hears cancels at its heartbeat only;
- repeated_finish: gives up a finishing write answered UNAVAILABLE;
- frozen_second_attempt: keys attempts by job id (and names no held leases), so
  it drops an attempt 2 of a job it still thinks it runs;
- checkpoint_resume: ignores the checkpoint a claimed job arrives with;
- drain: exits 3 when a Claim finds the server unavailable;
- graceful_stop: exits at once on SIGTERM, leaving its jobs to their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format, struct_pb2

from leasehold.v1 import worker_pb2, worker_pb2_grpc

T = TypeVar("T")

BREAK = os.environ.get("RAW_WORKER_BREAK", "")
CONCURRENCY = 4
CLAIM_WAIT_SECONDS = 20.0
STOP_GRACE_SECONDS = 5.0
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def log(*words: object) -> None:
    print("raw_worker:", *words, file=sys.stderr, flush=True)


@dataclass
class Attempt:
    claimed: worker_pb2.ClaimedJob
    expires_at: float  # time.time() seconds
    interval: float
    stop_cause: str | None = None  # "cancelled", "lost" or "shutdown"
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def job_id(self) -> str:
        return str(self.claimed.job.id)

    @property
    def token(self) -> str:
        return str(self.claimed.lease_token)

    def stop(self, cause: str) -> None:
        if self.stop_cause is None:
            self.stop_cause = cause
            self.stopped.set()


class RawWorker:
    def __init__(self, server: str, token: str, kind: str) -> None:
        self.channel = grpc.aio.insecure_channel(server)
        self.stub = worker_pb2_grpc.WorkerServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.kind = kind
        # By job id and lease token together: the jobs of one Claim share its
        # token, and the same job id may come back as attempt 2 while attempt
        # 1 is still held (the broken variant keys by job id alone).
        self.attempts: dict[tuple[str, str], Attempt] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.protocol = 1
        self.stopping = asyncio.Event()

    def key(self, claimed: worker_pb2.ClaimedJob) -> tuple[str, str]:
        token = "" if BREAK == "frozen_second_attempt" else str(claimed.lease_token)
        return (str(claimed.job.id), token)

    async def run(self) -> int:
        info = await self.stub.GetServerInfo(
            worker_pb2.GetServerInfoRequest(protocol_version=2), metadata=self.metadata, timeout=10
        )
        self.protocol = info.protocol_version
        claimer = asyncio.create_task(self.claim_loop())
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({claimer, stop}, return_when=asyncio.FIRST_COMPLETED)
        if claimer.done() and claimer.exception() is not None:
            log("claim loop ended:", repr(claimer.exception()))
            return 3
        claimer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await claimer
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=STOP_GRACE_SECONDS)
        for attempt in self.attempts.values():
            attempt.stop("shutdown")
        if self.tasks:
            await asyncio.wait(self.tasks)
        return 0

    async def claim_loop(self) -> None:
        delay = 0.1
        while True:
            while len(self.attempts) >= CONCURRENCY:
                await asyncio.sleep(0.05)
            hears_pushes = BREAK not in ("cancel_mid_run", "frozen_second_attempt") and self.protocol >= 2
            named = [a for a in self.attempts.values() if a.stop_cause is None and hears_pushes]
            held = [worker_pb2.LeaseRef(job_id=a.job_id, lease_token=a.token) for a in named]
            request = worker_pb2.ClaimRequest(
                worker_id=f"raw-{os.getpid()}",
                kinds=[self.kind],
                max_jobs=CONCURRENCY - len(self.attempts),
                wait_seconds=CLAIM_WAIT_SECONDS,
                held_leases=held,
            )
            try:
                response = await self.stub.Claim(
                    request, metadata=self.metadata, timeout=CLAIM_WAIT_SECONDS + 10
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in TRANSIENT:
                    raise
                if BREAK == "drain":
                    raise RuntimeError("the server went away") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.1
            for state in response.held:
                # The news names a job, not a lease: it is about an attempt
                # this Claim named, and when two of them share the job id (a
                # stale one and its successor) a heartbeat of each, which
                # answers per lease, says which.
                mine = [a for a in named if a.job_id == state.job_id]
                if len(mine) == 1:
                    mine[0].stop("lost" if state.lost else "cancelled")
                for attempt in mine if len(mine) > 1 else []:
                    await self.beat(attempt)
            for claimed in response.jobs:
                self.start(claimed)

    def start(self, claimed: worker_pb2.ClaimedJob) -> None:
        key = self.key(claimed)
        if key in self.attempts:
            log("dropping a job it already runs:", claimed.job.id)
            return
        expires = claimed.lease_expires_at.ToDatetime(tzinfo=UTC).timestamp()
        attempt = Attempt(claimed, expires, claimed.heartbeat_interval_seconds or 2.0)
        self.attempts[key] = attempt
        task = asyncio.create_task(self.run_attempt(key, attempt))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run_attempt(self, key: tuple[str, str], attempt: Attempt) -> None:
        beats = asyncio.create_task(self.heartbeats(attempt))
        try:
            result = await self.handle(attempt)
        finally:
            beats.cancel()
        try:
            await self.finish(attempt, result)
        except grpc.aio.AioRpcError as exc:
            log("finishing write failed:", attempt.job_id, exc.code().name)
        finally:
            del self.attempts[key]

    async def handle(self, attempt: Attempt) -> dict[str, Any] | None:
        """The contract; None when stopped before the end."""
        payload = json_format.MessageToDict(attempt.claimed.payload)
        resumed_from = None
        if attempt.claimed.HasField("checkpoint") and BREAK != "checkpoint_resume":
            resumed_from = json_format.MessageToDict(attempt.claimed.checkpoint)
        checkpoint = payload.get("checkpoint")
        if checkpoint is not None and self.protocol >= 2:
            await self.beat(attempt, json_format.ParseDict(checkpoint, struct_pb2.Struct()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(float(payload.get("sleep_ms", 0)) / 1000):
                await attempt.stopped.wait()
        if attempt.stop_cause is not None:
            return None
        return {"echo": payload.get("echo"), "resumed_from": resumed_from}

    async def heartbeats(self, attempt: Attempt) -> None:
        interval = attempt.interval
        left = attempt.expires_at - time.time()
        # A job that arrives with little lease left is renewed at once.
        first = 0.0 if left < interval and BREAK != "little_lease_left" else interval
        await asyncio.sleep(first)
        while attempt.stop_cause is None:
            await self.beat(attempt)
            await asyncio.sleep(interval)

    async def beat(self, attempt: Attempt, checkpoint: struct_pb2.Struct | None = None) -> None:
        ref = worker_pb2.LeaseRef(job_id=attempt.job_id, lease_token=attempt.token, checkpoint=checkpoint)
        try:
            response = await self.stub.Heartbeat(
                worker_pb2.HeartbeatRequest(leases=[ref]), metadata=self.metadata, timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            log("heartbeat failed:", exc.code().name)
            return
        for state in response.states:
            if state.lost:
                attempt.stop("lost")
            elif state.cancel_requested:
                attempt.stop("cancelled")
            elif state.HasField("lease_expires_at"):
                attempt.expires_at = state.lease_expires_at.ToDatetime(tzinfo=UTC).timestamp()

    async def finish(self, attempt: Attempt, result: dict[str, Any] | None) -> None:
        lease = {"job_id": attempt.job_id, "lease_token": attempt.token}
        cause = attempt.stop_cause
        if cause == "lost":
            return  # nothing more, ever: another attempt may be running
        if cause == "cancelled":
            await self.write(
                lambda: self.stub.ConfirmCancel(worker_pb2.ConfirmCancelRequest(**lease), **self.call)
            )
        elif cause == "shutdown":
            request = worker_pb2.SnoozeRequest(**lease, delay_seconds=1)
            await self.write(lambda: self.stub.Snooze(request, **self.call))
        else:
            struct = struct_pb2.Struct()
            if BREAK != "round_trip":
                struct.update(result or {})
            complete = worker_pb2.CompleteRequest(**lease, result=struct)
            await self.write(lambda: self.stub.Complete(complete, **self.call))

    @property
    def call(self) -> dict[str, Any]:
        return {"metadata": self.metadata, "timeout": 10}

    async def write(self, send: Callable[[], Awaitable[T]]) -> T | None:
        """Retried after UNAVAILABLE with the same lease token: protocol 2
        answers a repeat of a write that landed as the first was answered."""
        delay = 0.1
        for _ in range(20):
            try:
                return await send()
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.ABORTED:
                    return None  # the lease is gone
                if exc.code() not in TRANSIENT or BREAK == "repeated_finish":
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        return None


async def main() -> int:
    worker = RawWorker(
        os.environ["LEASEHOLD_SERVER"], os.environ["LEASEHOLD_WORKER_TOKEN"], os.environ["LEASEHOLD_KIND"]
    )
    loop = asyncio.get_running_loop()
    if BREAK == "graceful_stop":
        loop.add_signal_handler(signal.SIGTERM, lambda: os._exit(0))
    else:
        loop.add_signal_handler(signal.SIGTERM, worker.stopping.set)
    log("started; broken:", BREAK or "nothing", "at", datetime.now(UTC).isoformat())
    return await worker.run()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

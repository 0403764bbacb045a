"""The conformance rules: each plays one of a server's tricks on the worker
under test and judges what it did.

A rule returns a `Verdict`; it never raises for a worker's misbehaviour. Every
wait is bounded and ends on something observed (a call the proxy recorded, a
job's state read through JobService, a process's exit), never on a guessed
sleep. Times compared are the proxy's monotonic clock.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format

from leasehold._server.conformance.proxy import (
    Call,
    FinishingWrite,
    WorkerServiceProxy,
    finishing_writes,
    names_lease,
)
from leasehold._server.conformance.stage import LEASE_SECONDS, Jobs, Server, WorkerProcess
from leasehold.v1 import jobs_pb2, worker_pb2

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# How long a worker may take to claim a job it is offered (it may still be
# starting, on a loaded machine).
CLAIM_SECONDS = 30.0
# The round-trip payload: snake_case keys, nesting, every JSON type, a null.
ROUND_TRIP_ECHO: dict[str, Any] = {
    "invoice_id": "A-1",
    "total": 12.5,
    "lines": [{"sku_code": "x", "qty": 2}],
    "paid": True,
    "note": None,
}
# The checkpoint a job carries so that its start shows (Stage.started).
STARTED = {"started": True}
# little_lease_left: the lease the proxy tells the worker it has left.
SHORT_LEASE_SECONDS = 1.5
# cancel_mid_run: how soon after the cancel the attempt must end. The cancel
# is asked just after one of the worker's regular heartbeats, so a worker that
# hears of cancels only at its next beat takes a whole interval (2 s with a
# 6 s lease); one that uses protocol 2's pushes takes a fraction of a second.
CANCEL_SECONDS = 1.0
# repeated_finish: how long the worker has to send the finishing write again.
RETRY_SECONDS = 5.0
# graceful_stop: how long the worker may take to exit after SIGTERM.
STOP_SECONDS = 10.0


@dataclass(frozen=True)
class Verdict:
    rule: str
    outcome: str  # PASS, FAIL or SKIP
    reason: str


@dataclass
class Stage:
    kind: str
    server: Server
    proxy: WorkerServiceProxy
    worker: WorkerProcess
    jobs: Jobs

    async def ensure_worker(self) -> None:
        """A rule starts with the worker running (an earlier rule may have
        stopped or killed it)."""
        if not self.worker.running:
            await self.worker.start()

    def claims_of(self, job_id: str) -> list[worker_pb2.ClaimedJob]:
        """Every ClaimedJob the worker was handed for `job_id`, in order."""
        return [
            claimed
            for call in self.proxy.of("Claim")
            if call.response is not None and call.code is grpc.StatusCode.OK
            for claimed in call.response.jobs
            if claimed.job.id == job_id
        ]

    async def claimed(
        self, job_id: str, attempt: int = 1, timeout: float = CLAIM_SECONDS
    ) -> worker_pb2.ClaimedJob | None:
        """The ClaimedJob of that attempt once the worker has it, else None."""

        def found() -> worker_pb2.ClaimedJob | bool | None:
            claimed = next((c for c in self.claims_of(job_id) if c.job.attempt == attempt), None)
            # A worker that exited will not claim it: no use waiting out the timeout.
            return claimed if claimed is not None or self.worker.running else True

        claimed = await self.proxy.wait_for(found, timeout)
        return claimed if isinstance(claimed, worker_pb2.ClaimedJob) else None

    async def started(self, job_id: str, attempt: int = 1) -> worker_pb2.ClaimedJob | None:
        """The ClaimedJob once the worker is running it, else None. Its claim
        alone is not enough: a signal sent the moment the proxy passed the
        Claim answer on may reach the worker before the answer does. A
        Heartbeat naming the lease shows the worker holds it; the jobs that
        need this carry a checkpoint (STARTED), which a protocol-2 worker sends
        at once, and a protocol-1 worker's first regular beat comes within an
        interval."""
        claimed = await self.claimed(job_id, attempt)
        if claimed is None:
            return None
        token = claimed.lease_token

        def beat() -> bool:
            return any(
                call.answered_at is not None and names_lease(call, job_id, token)
                for call in self.proxy.of("Heartbeat")
            )

        return claimed if await self.proxy.wait_for(beat, LEASE_SECONDS) else None

    def writes(self, job_id: str) -> list[FinishingWrite]:
        """The finishing writes the worker sent for `job_id`, in order (single
        calls, or outcomes of Finish calls)."""
        return [
            write for call in self.proxy.calls for write in finishing_writes(call) if write.job_id == job_id
        ]

    def protocol(self) -> int:
        """The protocol the worker was last answered in GetServerInfo (1 if it never asked)."""
        answered = [call for call in self.proxy.of("GetServerInfo") if call.response is not None]
        return answered[-1].response.protocol_version if answered else 1


Rule = Callable[[Stage], Awaitable[Verdict]]


def _status(job: jobs_pb2.Job) -> str:
    return jobs_pb2.JobStatus.Name(job.status).removeprefix("JOB_STATUS_").lower()


def _result(job: jobs_pb2.Job) -> dict[str, Any]:
    return json_format.MessageToDict(job.result) if job.HasField("result") else {}


def _ended(rule: str, job: jobs_pb2.Job, status: int, attempt: int) -> Verdict | None:
    """FAIL unless the job ended `status` at `attempt`; None when it did."""
    if job.status == status and job.attempt == attempt:
        return None
    want = jobs_pb2.JobStatus.Name(status).removeprefix("JOB_STATUS_").lower()
    detail = f": {job.error_type}: {job.error_message}" if job.error_message else ""
    return Verdict(
        rule,
        FAIL,
        f"expected {want} at attempt {attempt}, got {_status(job)} at attempt {job.attempt}{detail}",
    )


async def _not_claimed(stage: Stage, rule: str, job: jobs_pb2.Job) -> Verdict:
    await stage.jobs.cancel(job.id)
    if not stage.worker.running:
        return Verdict(rule, FAIL, f"the worker exited ({stage.worker.returncode}) before it claimed the job")
    return Verdict(rule, FAIL, f"the worker did not claim the job within {CLAIM_SECONDS:g} s")


async def _not_started(stage: Stage, rule: str, job: jobs_pb2.Job) -> Verdict:
    await stage.jobs.cancel(job.id)
    if not stage.worker.running:
        return Verdict(rule, FAIL, f"the worker exited ({stage.worker.returncode}) before it ran the job")
    return Verdict(rule, FAIL, "the worker did not claim the job, or sent no Heartbeat for it once it had")


async def round_trip(stage: Stage) -> Verdict:
    """A payload with snake_case keys and nested values comes back intact."""
    rule = "round_trip"
    job = await stage.jobs.enqueue(stage.kind, {"echo": ROUND_TRIP_ECHO})
    if await stage.claimed(job.id) is None:
        return await _not_claimed(stage, rule, job)
    done, ended = await stage.jobs.terminal(job.id, LEASE_SECONDS * 3)
    if not ended:
        await stage.jobs.cancel(job.id)
    failed = _ended(rule, done, jobs_pb2.JOB_STATUS_SUCCEEDED, 1)
    if failed is not None:
        return failed
    echo = _result(done).get("echo", "<missing>")
    if echo != ROUND_TRIP_ECHO:
        return Verdict(rule, FAIL, f"result echo was {echo!r}, expected {ROUND_TRIP_ECHO!r}")
    return Verdict(rule, PASS, "the payload came back unchanged in the result")


async def little_lease_left(stage: Stage) -> Verdict:
    """A job claimed with little lease left is renewed at once."""
    rule = "little_lease_left"
    job = await stage.jobs.enqueue(stage.kind, {"sleep_ms": 3000})
    stage.proxy.shorten_lease(job.id, SHORT_LEASE_SECONDS)
    told = await stage.proxy.wait_for(lambda: stage.proxy.short_lease_told(job.id), CLAIM_SECONDS)
    if told is None:
        return await _not_claimed(stage, rule, job)
    token, expiry = told

    def renewal() -> Call | None:
        return next(
            (call for call in stage.proxy.of("Heartbeat") if names_lease(call, job.id, token)),
            None,
        )

    # Waits a little past the expiry told, to say how late a late beat was.
    beat = await stage.proxy.wait_for(renewal, max(0.0, expiry - time.monotonic()) + 3.0)
    done, ended = await stage.jobs.terminal(job.id, LEASE_SECONDS * 3)
    if not ended:
        await stage.jobs.cancel(job.id)
    if beat is None:
        return Verdict(rule, FAIL, f"no Heartbeat for a lease told to end in {SHORT_LEASE_SECONDS:g} s")
    if beat.received_at > expiry:
        late = beat.received_at - expiry
        return Verdict(
            rule,
            FAIL,
            f"the first Heartbeat came {late:.1f} s after the {SHORT_LEASE_SECONDS:g} s of lease left "
            "had run out (renew a job that arrives with little lease left at once)",
        )
    failed = _ended(rule, done, jobs_pb2.JOB_STATUS_SUCCEEDED, 1)
    if failed is not None:
        return failed
    return Verdict(rule, PASS, "renewed a job that arrived with little lease left before it ran out")


async def cancel_mid_run(stage: Stage) -> Verdict:
    """A cancel reaches a running attempt long before its next heartbeat."""
    rule = "cancel_mid_run"
    job = await stage.jobs.enqueue(stage.kind, {"sleep_ms": 20_000})
    claimed = await stage.claimed(job.id)
    if claimed is None:
        return await _not_claimed(stage, rule, job)
    token = claimed.lease_token

    def beat_answered() -> Call | None:
        return next(
            (
                call
                for call in stage.proxy.of("Heartbeat")
                if call.answered_at is not None and names_lease(call, job.id, token)
            ),
            None,
        )

    # Right after a regular beat, so the next one is a whole interval away.
    if await stage.proxy.wait_for(beat_answered, LEASE_SECONDS) is None:
        await stage.jobs.cancel(job.id)
        return Verdict(rule, FAIL, f"no Heartbeat for a running job within {LEASE_SECONDS:g} s")
    await stage.jobs.cancel(job.id)
    asked = time.monotonic()
    write = await stage.proxy.wait_for(lambda: stage.writes(job.id), LEASE_SECONDS * 2)
    done, _ = await stage.jobs.terminal(job.id, LEASE_SECONDS * 2)
    if write is None:
        return Verdict(
            rule, FAIL, f"the worker wrote nothing after the cancel: the job ended {_status(done)}"
        )
    first: FinishingWrite = write[0]
    took = first.call.received_at - asked
    failed = _ended(rule, done, jobs_pb2.JOB_STATUS_CANCELLED, 1)
    if failed is not None:
        return failed
    if took > CANCEL_SECONDS:
        return Verdict(
            rule,
            FAIL,
            f"the attempt ended {took:.1f} s after the cancel (more than {CANCEL_SECONDS:g} s: "
            "use held_leases on Claim and cancel_requested on Heartbeat)",
        )
    return Verdict(rule, PASS, f"ended cancelled by {first.method} {took:.2f} s after the cancel")


async def repeated_finish(stage: Stage) -> Verdict:
    """A finishing write whose answer was lost is sent again, not given up."""
    rule = "repeated_finish"
    job = await stage.jobs.enqueue(stage.kind, {"echo": "again"})
    stage.proxy.lose_finish_answer(job.id)
    if await stage.claimed(job.id) is None:
        return await _not_claimed(stage, rule, job)

    def retried() -> list[FinishingWrite] | None:
        writes = [write for write in stage.writes(job.id) if write.call.answered_at is not None]
        return writes if len(writes) >= 2 else None

    writes = await stage.proxy.wait_for(retried, RETRY_SECONDS)
    done, _ = await stage.jobs.terminal(job.id, LEASE_SECONDS * 2)
    every = stage.writes(job.id)
    if not every:
        return Verdict(rule, FAIL, "the worker sent no finishing write")
    if writes is None:
        return Verdict(
            rule,
            FAIL,
            f"{every[0].method} was answered UNAVAILABLE and never sent again "
            "(retry a finishing write with the same lease token)",
        )
    first, second = writes[0], writes[1]
    if second.lease_token != first.lease_token:
        return Verdict(rule, FAIL, "the retry carried another lease token")
    if not second.answered_ok:
        answer = second.call.code.name if second.call.code is not grpc.StatusCode.OK else "lost or invalid"
        return Verdict(rule, FAIL, f"the retry ({second.method}) was answered {answer}")
    if any(write.method == "Fail" for write in every):
        return Verdict(rule, FAIL, "the worker sent Fail after the lost answer")
    if len(stage.claims_of(job.id)) > 1:
        return Verdict(rule, FAIL, "the job ran again (a second attempt was claimed)")
    failed = _ended(rule, done, jobs_pb2.JOB_STATUS_SUCCEEDED, 1)
    if failed is not None:
        return failed
    return Verdict(rule, PASS, f"{first.method} sent again after UNAVAILABLE and answered OK")


async def frozen_second_attempt(stage: Stage) -> Verdict:
    """A worker frozen past its lease runs the attempt 2 it is handed on waking."""
    rule = "frozen_second_attempt"
    job = await stage.jobs.enqueue(
        stage.kind, {"sleep_ms": int(2 * LEASE_SECONDS * 1000), "checkpoint": STARTED}
    )
    if await stage.started(job.id) is None:
        return await _not_started(stage, rule, job)
    stage.worker.signal(signal.SIGSTOP)
    try:
        # Recovered: queued again, or already handed (as attempt 2) to the
        # frozen worker's open Claim.
        _, recovered = await stage.jobs.wait_for(
            job.id,
            lambda current: current.status == jobs_pb2.JOB_STATUS_QUEUED or current.attempt >= 2,
            LEASE_SECONDS * 4,
        )
    finally:
        stage.worker.signal(signal.SIGCONT)
    if not recovered:
        await stage.jobs.cancel(job.id)
        return Verdict(rule, FAIL, "the server did not recover the frozen worker's lease (see serve.log)")
    done, _ = await stage.jobs.wait_for(
        job.id,
        lambda current: (
            current.status
            in (
                jobs_pb2.JOB_STATUS_SUCCEEDED,
                jobs_pb2.JOB_STATUS_FAILED,
                jobs_pb2.JOB_STATUS_CANCELLED,
            )
            or current.attempt >= 3
        ),
        LEASE_SECONDS * 6,
    )
    if done.status not in (jobs_pb2.JOB_STATUS_SUCCEEDED, jobs_pb2.JOB_STATUS_FAILED):
        await stage.jobs.cancel(job.id)
    if done.attempt >= 3:
        return Verdict(
            rule,
            FAIL,
            "attempt 2 was not run: the job went on to attempt 3 "
            "(keep attempts by job id and lease token, not job id alone)",
        )
    failed = _ended(rule, done, jobs_pb2.JOB_STATUS_SUCCEEDED, 2)
    if failed is not None:
        return failed
    return Verdict(rule, PASS, "ran attempt 2 to success after waking from a freeze past the lease")


async def checkpoint_resume(stage: Stage) -> Verdict:
    """The next attempt of a killed worker's job resumes from its checkpoint."""
    rule = "checkpoint_resume"
    checkpoint = {"step": 7}
    job = await stage.jobs.enqueue(stage.kind, {"checkpoint": checkpoint, "sleep_ms": 3000})
    claimed = await stage.claimed(job.id)
    if claimed is None:
        return await _not_claimed(stage, rule, job)
    # Known by now: a worker asks GetServerInfo before it claims.
    if stage.protocol() < 2:
        await stage.jobs.cancel(job.id)
        return Verdict(rule, SKIP, "the worker speaks protocol 1, which has no checkpoints")
    token = claimed.lease_token

    def saved() -> Call | None:
        return next(
            (
                call
                for call in stage.proxy.of("Heartbeat")
                if call.code is grpc.StatusCode.OK
                and call.response is not None
                and any(
                    lease.job_id == job.id and lease.lease_token == token and lease.HasField("checkpoint")
                    for lease in call.request.leases
                )
                and not any(state.lost for state in call.response.states)
            ),
            None,
        )

    if await stage.proxy.wait_for(saved, LEASE_SECONDS) is None:
        await stage.jobs.cancel(job.id)
        return Verdict(rule, FAIL, "the worker never saved the payload's checkpoint with a Heartbeat")
    await stage.worker.kill()
    await stage.worker.start()
    done, _ = await stage.jobs.terminal(job.id, LEASE_SECONDS * 6)
    if done.status not in (jobs_pb2.JOB_STATUS_SUCCEEDED, jobs_pb2.JOB_STATUS_FAILED):
        await stage.jobs.cancel(job.id)
    failed = _ended(rule, done, jobs_pb2.JOB_STATUS_SUCCEEDED, 2)
    if failed is not None:
        return failed
    resumed = _result(done).get("resumed_from")
    if resumed != checkpoint:
        return Verdict(rule, FAIL, f"attempt 2 resumed from {resumed!r}, expected {checkpoint!r}")
    return Verdict(rule, PASS, "attempt 2 resumed from the checkpoint attempt 1 saved")


async def graceful_stop(stage: Stage) -> Verdict:
    """SIGTERM: the worker exits 0 soon and leaves no job to its lease."""
    rule = "graceful_stop"
    job = await stage.jobs.enqueue(stage.kind, {"sleep_ms": 3000, "checkpoint": STARTED})
    if await stage.started(job.id) is None:
        return await _not_started(stage, rule, job)
    stage.worker.signal(signal.SIGTERM)
    code = await stage.worker.exited(STOP_SECONDS)
    current = await stage.jobs.get(job.id)
    if code is None:
        await stage.worker.kill()
        await stage.worker.start()
        return Verdict(rule, FAIL, f"the worker was still running {STOP_SECONDS:g} s after SIGTERM")
    await stage.worker.start()
    if code != 0:
        return Verdict(rule, FAIL, f"the worker exited {code} after SIGTERM, not 0")
    finished = current.status == jobs_pb2.JOB_STATUS_SUCCEEDED and current.attempt == 1
    handed_back = current.status == jobs_pb2.JOB_STATUS_QUEUED and current.attempt == 0
    if not (finished or handed_back):
        return Verdict(
            rule,
            FAIL,
            f"after the worker exited the job was {_status(current)} at attempt {current.attempt} "
            "(finish it, or hand it back with Snooze, before exiting)",
        )
    # The handed-back job runs on the restarted worker; the rule does not wait for it.
    how = "finished its job" if finished else "handed its job back uncounted"
    return Verdict(rule, PASS, f"exited 0 after SIGTERM and {how}")


async def drain(stage: Stage) -> Verdict:
    """A draining server: the running job still succeeds, and the worker rides
    out the server's absence. Played last: the server is restarted after."""
    rule = "drain"
    job = await stage.jobs.enqueue(stage.kind, {"sleep_ms": 3000, "checkpoint": STARTED})
    if await stage.started(job.id) is None:
        return await _not_started(stage, rule, job)
    stage.server.drain()
    stopped = await stage.server.exited(60.0)
    gone = time.monotonic()
    # The worker meets the missing server: at least one call answered
    # UNAVAILABLE after the server exited, and a moment to react to it.
    await stage.proxy.wait_for(
        lambda: any(call.received_at > gone and call.answered_at is not None for call in stage.proxy.calls),
        10.0,
    )
    await stage.worker.exited(1.0)
    code = stage.worker.returncode
    await stage.server.start()
    await stage.proxy.reconnect()
    await stage.jobs.reconnect()
    if stopped is None:
        return Verdict(rule, FAIL, "the server did not finish draining within 60 s (see serve.log)")
    if code is not None and code != 0:
        return Verdict(rule, FAIL, f"the worker exited {code} while the server was gone")
    done, _ = await stage.jobs.terminal(job.id, LEASE_SECONDS * 3)
    failed = _ended(rule, done, jobs_pb2.JOB_STATUS_SUCCEEDED, 1)
    if failed is not None:
        return failed
    return Verdict(rule, PASS, "the job finished during the drain and the worker kept running")


# In the order they are played: drain restarts the server, so it comes last.
RULES: dict[str, Rule] = {
    "round_trip": round_trip,
    "little_lease_left": little_lease_left,
    "cancel_mid_run": cancel_mid_run,
    "repeated_finish": repeated_finish,
    "frozen_second_attempt": frozen_second_attempt,
    "checkpoint_resume": checkpoint_resume,
    "graceful_stop": graceful_stop,
    "drain": drain,
}

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from structlog.testing import capture_logs

from leasehold._server.clock import ManualClock, SystemClock
from leasehold._server.jobs import limits, state_machine
from leasehold._server.jobs.errors import StorageUnavailable
from leasehold._server.jobs.records import JobStatus, Lease
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.runtime.claim_loop import Runtime, RuntimeSettings
from leasehold.worker import HandlerRegistry, JobContext, PermanentError
from tests.contract.helpers import claim_one
from tests.runtime.helpers import (
    RenewSpy,
    enqueue,
    running,
    wait_for_terminal,
)
from tests.support import OWNER, Gate, test_registry


def test_registering_a_kind_twice_raises() -> None:
    registry = HandlerRegistry()
    registry.register("a.kind", Gate().handler)

    with pytest.raises(ValueError, match="already registered"):
        registry.register("a.kind", Gate().handler)


@pytest.mark.parametrize("kind", ["", "Upper", "spa ce", "x" * 129])
def test_registering_an_invalid_kind_raises(kind: str) -> None:
    with pytest.raises(ValueError, match="invalid job kind"):
        HandlerRegistry().register(kind, Gate().handler)


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("concurrency", {"concurrency": 0}),
        ("lease_seconds", {"lease_seconds": 5.9}),
        ("poll_seconds", {"poll_seconds": 0.01}),
    ],
)
def test_runtime_settings_name_the_bad_field(field: str, overrides: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=field):
        RuntimeSettings(**overrides)  # type: ignore[arg-type]


async def test_a_job_runs_to_success_with_its_events(live_repository: JobRepository) -> None:
    async with running(live_repository, test_registry(), SystemClock()):
        job = await enqueue(live_repository, "example.echo", {"hello": "world"})
        done = await wait_for_terminal(live_repository, job.id)

    assert done.status is JobStatus.SUCCEEDED and done.attempt == 1
    events = await live_repository.list_events(OWNER, job.id, 0, 100)
    assert [(e.type, e.payload) for e in events] == [
        ("job.queued", {}),
        ("job.started", {"attempt": 1}),
        ("echo", {"hello": "world"}),
        ("job.succeeded", {}),
    ]


async def test_an_idle_runtime_wakes_on_enqueue_not_on_its_poll(
    live_repository: JobRepository,
) -> None:
    # With a one-minute safety-net poll, only the commit announcement can start
    # the job within the test's time limit.
    settings = RuntimeSettings(poll_seconds=60, lease_seconds=6)
    async with running(live_repository, test_registry(), SystemClock(), settings):
        await asyncio.sleep(0)  # let the claimer go idle
        job = await enqueue(live_repository, "example.echo")
        done = await wait_for_terminal(live_repository, job.id, timeout=5)

    assert done.status is JobStatus.SUCCEEDED


async def test_a_retry_starts_when_its_backoff_is_due_not_on_the_poll(
    live_repository: JobRepository,
) -> None:
    settings = RuntimeSettings(poll_seconds=60, lease_seconds=6)
    async with running(live_repository, test_registry(), SystemClock(), settings):
        job = await enqueue(live_repository, "example.fail", {"message": "once", "times": 1})
        done = await wait_for_terminal(live_repository, job.id, timeout=10)

    assert done.status is JobStatus.SUCCEEDED and done.attempt == 2
    types = [e.type for e in await live_repository.list_events(OWNER, job.id, 0, 100)]
    assert types == [
        "job.queued",
        "job.started",
        "job.retry_scheduled",
        "job.started",
        "job.succeeded",
    ]


async def test_start_is_idempotent(live_repository: JobRepository) -> None:
    executions: list[str] = []

    async def count(ctx: JobContext) -> None:
        executions.append(ctx.job_id)

    registry = HandlerRegistry()
    registry.register("test.count", count)
    async with running(live_repository, registry, SystemClock()) as runtime:
        await runtime.start()
        await runtime.start()
        jobs = [await enqueue(live_repository, "test.count") for _ in range(10)]
        for job in jobs:
            await wait_for_terminal(live_repository, job.id)

    assert sorted(executions) == sorted(job.id for job in jobs)


async def test_no_more_jobs_run_at_once_than_the_concurrency(
    live_repository: JobRepository,
) -> None:
    gate = Gate()
    settings = RuntimeSettings(concurrency=2, poll_seconds=0.05, lease_seconds=6)
    async with running(live_repository, test_registry(gate), SystemClock(), settings) as runtime:
        jobs = [await enqueue(live_repository, "test.gate") for _ in range(3)]
        async with asyncio.timeout(5):
            while len(gate.contexts) < 2:
                await asyncio.sleep(0.01)
        waiting = [await live_repository.get(OWNER, job.id) for job in jobs]

        assert runtime.active_jobs == 2
        assert sorted(job.status.value for job in waiting) == ["queued", "running", "running"]
        gate.release.set()
        for job in jobs:
            assert (await wait_for_terminal(live_repository, job.id)).status is JobStatus.SUCCEEDED
    assert len(gate.contexts) == 3


async def test_a_handler_over_its_timeout_fails_with_the_timeout_text(
    live_repository: JobRepository,
) -> None:
    gate = Gate()  # never released
    async with running(live_repository, test_registry(gate), SystemClock()):
        job = await enqueue(live_repository, "test.gate", timeout_seconds=1, max_attempts=1)
        done = await wait_for_terminal(live_repository, job.id)

    assert done.status is JobStatus.FAILED
    assert done.error_message == state_machine.TIMEOUT_ERROR_TEXT


async def test_a_handlers_own_timeout_error_is_an_ordinary_failure(
    live_repository: JobRepository,
) -> None:
    async def upstream_timeout(ctx: JobContext) -> None:
        raise TimeoutError("upstream took too long")

    registry = HandlerRegistry()
    registry.register("test.upstream", upstream_timeout)
    async with running(live_repository, registry, SystemClock()):
        job = await enqueue(live_repository, "test.upstream", max_attempts=1)
        done = await wait_for_terminal(live_repository, job.id)

    assert done.error_message == "upstream took too long"


async def test_a_permanent_error_fails_without_using_remaining_attempts(
    live_repository: JobRepository,
) -> None:
    async def reject(ctx: JobContext) -> None:
        raise PermanentError("payload is not valid")

    registry = HandlerRegistry()
    registry.register("test.reject", reject)
    async with running(live_repository, registry, SystemClock()):
        job = await enqueue(live_repository, "test.reject", max_attempts=5)
        done = await wait_for_terminal(live_repository, job.id)

    assert (done.status, done.attempt, done.error_message) == (
        JobStatus.FAILED,
        1,
        "payload is not valid",
    )


async def test_a_job_whose_handler_disappeared_fails_through_the_failure_path(
    live_repository: JobRepository,
) -> None:
    job = await enqueue(live_repository, "test.removed", max_attempts=1)
    async with running(live_repository, test_registry(), SystemClock()):
        done = await wait_for_terminal(live_repository, job.id)

    assert done.status is JobStatus.FAILED
    assert done.error_message == "no handler is registered for kind 'test.removed'"
    last = (await live_repository.list_events(OWNER, job.id, 0, 100))[-1]
    assert last.type == "job.failed"


async def test_a_cancel_request_is_observed_at_the_handlers_safe_point(
    live_repository: JobRepository,
) -> None:
    gate = Gate()
    async with running(live_repository, test_registry(gate), SystemClock()):
        job = await enqueue(live_repository, "test.gate", {"check_cancel": True})
        await asyncio.wait_for(gate.started.wait(), 5)
        await live_repository.cancel(OWNER, job.id)
        gate.release.set()
        done = await wait_for_terminal(live_repository, job.id)

    assert done.status is JobStatus.CANCELLED
    types = [e.type for e in await live_repository.list_events(OWNER, job.id, 0, 100)]
    assert types[-2:] == ["job.cancel_requested", "job.cancelled"]


async def test_a_cancel_requested_before_the_attempt_skips_the_handler(
    live_repository: JobRepository,
) -> None:
    """A job handed back by a shutdown after its owner asked to cancel it is
    claimed with the request already on it: the handler never runs."""
    ran: list[str] = []

    async def record(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    job = await enqueue(live_repository, "test.record")
    first = await claim_one(live_repository)
    await live_repository.cancel(OWNER, job.id)
    await live_repository.release(first.lease)

    registry = HandlerRegistry()
    registry.register("test.record", record)
    async with running(live_repository, registry, SystemClock()):
        done = await wait_for_terminal(live_repository, job.id)

    assert ran == []
    assert done.status is JobStatus.CANCELLED


async def test_a_cancel_requested_while_the_handler_runs_wins_even_if_it_never_checks(
    live_repository: JobRepository,
) -> None:
    gate = Gate()
    async with running(live_repository, test_registry(gate), SystemClock()):
        job = await enqueue(live_repository, "test.gate")
        await asyncio.wait_for(gate.started.wait(), 5)
        await live_repository.cancel(OWNER, job.id)
        gate.release.set()
        done = await wait_for_terminal(live_repository, job.id)

    assert done.status is JobStatus.CANCELLED
    events = await live_repository.list_events(OWNER, job.id, 0, 10)
    assert [e.type for e in events][-2:] == ["job.cancel_requested", "job.cancelled"]


async def test_heartbeats_keep_a_long_job_leased(repository: JobRepository, clock: ManualClock) -> None:
    spy = RenewSpy(repository)
    gate = Gate()
    async with running(spy, test_registry(gate), clock):  # type: ignore[arg-type]
        job = await enqueue(repository, "test.gate")
        await asyncio.wait_for(gate.started.wait(), 5)
        clock.advance(5)  # one second of lease left
        await asyncio.wait_for(spy.renewed.wait(), 5)  # heartbeat every lease/3 = 2 s
        clock.advance(5)  # past the first expiry, inside the renewed lease

        stolen = await repository.claim("thief", 1, 6)
        assert stolen.jobs == []
        gate.release.set()
        done = await wait_for_terminal(repository, job.id)
    assert done.status is JobStatus.SUCCEEDED and done.attempt == 1


async def test_a_handler_that_lost_its_lease_cannot_finish_the_job(
    repository: JobRepository, clock: ManualClock
) -> None:
    gate = Gate()
    # One slot, busy with the job: the runtime cannot reclaim it before the thief.
    settings = RuntimeSettings(concurrency=1, poll_seconds=0.05, lease_seconds=6)
    with capture_logs() as logs:
        async with running(repository, test_registry(gate), clock, settings) as runtime:
            job = await enqueue(repository, "test.gate")
            await asyncio.wait_for(gate.started.wait(), 5)
            clock.advance(7)  # the lease (6 s) is gone
            thief = (await repository.claim("thief", 1, 60)).jobs[0]
            gate.release.set()
            async with asyncio.timeout(5):
                while runtime.active_jobs:
                    await asyncio.sleep(0.01)

            current = await repository.get(OWNER, job.id)
            assert current.status is JobStatus.RUNNING and current.attempt == 2
            await repository.succeed(thief.lease)
    types = [e.type for e in await repository.list_events(OWNER, job.id, 0, 100)]
    assert types == [
        "job.queued",
        "job.started",
        "job.lease_expired",
        "job.started",
        "job.succeeded",
    ]
    assert any(record["event"] == "job.lease_lost" for record in logs)


async def test_a_heartbeat_that_finds_the_lease_gone_stops_the_handler_and_logs_it(
    repository: JobRepository, clock: ManualClock
) -> None:
    """The handler never returns on its own: only the heartbeat can notice the
    lost lease, and the attempt must end there, in the log as well."""
    gate = Gate()
    with capture_logs() as logs:
        async with running(repository, test_registry(gate), clock):
            job = await enqueue(repository, "test.gate")
            await asyncio.wait_for(gate.started.wait(), 5)
            first = gate.contexts[0]
            clock.advance(7)  # the lease (6 s) is gone; the next heartbeat is refused

            def lost() -> list[dict[str, object]]:
                return [r for r in logs if r["event"] == "job.lease_lost" and r.get("job_id") == job.id]

            async with asyncio.timeout(10):
                while not lost():
                    await asyncio.sleep(0.01)
            assert lost()[0]["attempt"] == first.attempt == 1
            assert not gate.release.is_set()  # the handler was stopped, it did not return


@pytest.mark.parametrize("cut_off", ["refused", "unanswered"])
async def test_a_lease_no_renewal_reaches_stops_its_handler_before_it_could_expire(
    repository: JobRepository, clock: ManualClock, cut_off: str
) -> None:
    """Cut off from the database, a replica cannot renew, nor hear that its
    lease is gone: every renewal fails as unavailable, or (packets dropped)
    is never answered. Its handler must stop on its own while the lease still
    holds (the clock stands still, so the lease never runs out here), or it
    would still be running when another replica recovers and claims the job."""
    renewals_tried = 0

    class CutOff:
        def __init__(self, inner: JobRepository) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

        async def renew(self, lease: Lease, lease_seconds: float) -> object:
            nonlocal renewals_tried
            renewals_tried += 1
            if cut_off == "unanswered":
                await asyncio.Event().wait()
            raise StorageUnavailable("database connection failed; retry later")

    gate = Gate()
    with capture_logs() as logs:
        async with running(CutOff(repository), test_registry(gate), clock):  # type: ignore[arg-type]
            job = await enqueue(repository, "test.gate")
            await asyncio.wait_for(gate.started.wait(), 5)

            def stopped() -> list[dict[str, object]]:
                return [r for r in logs if r["event"] == "job.lease_unrenewed" and r.get("job_id") == job.id]

            async with asyncio.timeout(15):  # a lease of 6 s, stopped a sixth of it early
                while not stopped():
                    await asyncio.sleep(0.01)
            assert not gate.release.is_set()  # stopped, not returned
            # The lease still holds: nobody else could have the job yet.
            assert (await repository.claim("thief", 1, 6)).jobs == []
            current = await repository.get(OWNER, job.id)
            assert (current.status, current.attempt) == (JobStatus.RUNNING, 1)
    assert renewals_tried >= 1
    assert stopped()[0]["attempt"] == 1


async def test_stop_hands_unfinished_work_back_to_the_queue(live_repository: JobRepository) -> None:
    gate = Gate()
    runtime = Runtime(live_repository, test_registry(gate), SystemClock(), RuntimeSettings())
    await runtime.start()
    job = await enqueue(live_repository, "test.gate")
    await asyncio.wait_for(gate.started.wait(), 5)

    await asyncio.wait_for(runtime.stop(), 2)

    after = await live_repository.get(OWNER, job.id)
    assert after.status is JobStatus.QUEUED and after.attempt == 0
    assert runtime.active_jobs == 0
    released = (await live_repository.list_events(OWNER, job.id, 0, 100))[-1]
    assert (released.type, released.payload) == ("job.released", {"attempt": 1})

    gate.release.set()
    async with running(live_repository, test_registry(gate), SystemClock()):
        done = await wait_for_terminal(live_repository, job.id)
    assert done.status is JobStatus.SUCCEEDED and done.attempt == 1


async def test_stop_lets_running_handlers_finish_within_the_grace(live_repository: JobRepository) -> None:
    gate = Gate()
    runtime = Runtime(live_repository, test_registry(gate), SystemClock(), RuntimeSettings())
    await runtime.start()
    job = await enqueue(live_repository, "test.gate")
    await asyncio.wait_for(gate.started.wait(), 5)

    stopping = asyncio.create_task(runtime.stop(grace_seconds=30))
    gate.release.set()
    await asyncio.wait_for(stopping, 10)

    assert (await live_repository.get(OWNER, job.id)).status is JobStatus.SUCCEEDED


async def test_a_handler_raising_cancelled_error_itself_fails_the_attempt(
    live_repository: JobRepository,
) -> None:
    async def cancelled_inside(ctx: JobContext) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future  # raises CancelledError, though nobody cancelled the handler

    registry = HandlerRegistry()
    registry.register("test.cancelled-inside", cancelled_inside)
    async with running(live_repository, registry, SystemClock()):
        job = await enqueue(live_repository, "test.cancelled-inside", max_attempts=1)
        done = await wait_for_terminal(live_repository, job.id, timeout=5)

    assert done.status is JobStatus.FAILED and done.attempt == 1


async def test_a_claimer_error_is_logged_and_claiming_goes_on(live_repository: JobRepository) -> None:
    failures = 0

    class FailingOnce:
        def __init__(self, inner: JobRepository) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

        async def claim(self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter):  # type: ignore[no-untyped-def]
            nonlocal failures
            if failures == 0:
                failures += 1
                raise RuntimeError("database file is corrupt")
            return await self._inner.claim(worker_id, limit, lease_seconds, kinds)

    with capture_logs() as logs:
        async with running(FailingOnce(live_repository), test_registry(), SystemClock()):  # type: ignore[arg-type]
            job = await enqueue(live_repository, "example.echo")
            done = await wait_for_terminal(live_repository, job.id, timeout=5)

    assert done.status is JobStatus.SUCCEEDED
    assert any(r["event"] == "runtime.claim_failed" for r in logs)


async def test_lifecycle_logs_name_the_job_but_never_the_payload(
    live_repository: JobRepository,
) -> None:
    secret = "SECRET-PAYLOAD-MARKER"
    with capture_logs() as logs:
        async with running(live_repository, test_registry(), SystemClock()):
            ok = await enqueue(live_repository, "example.echo", {"secret": secret})
            bad = await enqueue(
                live_repository, "example.fail", {"message": "nope", "secret": secret}, max_attempts=1
            )
            await wait_for_terminal(live_repository, ok.id)
            await wait_for_terminal(live_repository, bad.id)

    by_event = {(r["event"], r.get("job_id")): r for r in logs}
    assert by_event[("job.started", ok.id)]["kind"] == "example.echo"
    assert ("job.completed", ok.id) in by_event
    failed = by_event[("job.failed", bad.id)]
    assert failed["final"] is True and failed["error_class"] == "RuntimeError"
    assert secret not in repr(logs)


@pytest.mark.parametrize(
    "payload",
    [
        {"too_big": 10**400},
        {"nan": float("nan")},
        {"big": "x" * (limits.PAYLOAD_BYTES_LIMIT + 1)},
        {"not_json": object()},
    ],
)
async def test_a_handler_event_that_could_not_be_watched_is_refused(
    live_repository: JobRepository, payload: dict[str, object]
) -> None:
    async def emit(ctx: JobContext) -> None:
        await ctx.append_event("bad", payload)

    registry = HandlerRegistry()
    registry.register("test.emit", emit)
    async with running(live_repository, registry, SystemClock()):
        job = await enqueue(live_repository, "test.emit", max_attempts=1)
        done = await wait_for_terminal(live_repository, job.id)

    assert done.status is JobStatus.FAILED
    assert done.error_message is not None and done.error_message.startswith("payload:")
    types = [e.type for e in await live_repository.list_events(OWNER, job.id, 0, 100)]
    assert "bad" not in types


async def test_a_cancel_check_that_meets_a_storage_error_is_retried_not_failed(
    live_repository: JobRepository,
) -> None:
    """A handler checks for a cancel request at its safe points; a read the
    storage refuses for a moment must not cost the job an attempt (on every
    engine: the engine's StorageUnavailable is what the runtime rides out)."""
    refused = 0

    class RefusingCancelChecks:
        def __init__(self, inner: JobRepository) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

        async def cancel_requested(self, lease: Lease) -> bool:
            nonlocal refused
            if refused < 3:
                refused += 1
                raise StorageUnavailable("the database is busy")
            return await self._inner.cancel_requested(lease)

    async with running(RefusingCancelChecks(live_repository), test_registry(), SystemClock()):  # type: ignore[arg-type]
        job = await enqueue(live_repository, "example.sleep", {"seconds": 0, "steps": 1})
        done = await wait_for_terminal(live_repository, job.id)

    assert refused == 3
    assert (done.status, done.attempt) == (JobStatus.SUCCEEDED, 1)


async def test_a_sqlite_read_error_in_a_cancel_check_is_retried_not_failed(
    sqlite_live_repository: JobRepository,
) -> None:
    """The same through SQLite's own I/O error, translated by the SQL engine."""
    live_repository = sqlite_live_repository
    refused = 0

    def refuse_cancel_checks(_conn, _cursor, statement: str, parameters, _context, _many) -> None:  # type: ignore[no-untyped-def]
        nonlocal refused
        if statement.startswith("SELECT jobs.id, jobs.lease_token, jobs.cancel_requested_at") and refused < 3:
            refused += 1
            original = sqlite3.OperationalError("disk I/O error")
            original.sqlite_errorname = "SQLITE_IOERR_READ"  # type: ignore[attr-defined]
            raise OperationalError(statement, parameters, original)

    event.listen(Engine, "before_cursor_execute", refuse_cancel_checks)
    try:
        async with running(live_repository, test_registry(), SystemClock()):
            # example.sleep checks for a cancel request after each step.
            job = await enqueue(live_repository, "example.sleep", {"seconds": 0, "steps": 1})
            done = await wait_for_terminal(live_repository, job.id)
    finally:
        event.remove(Engine, "before_cursor_execute", refuse_cancel_checks)

    assert refused == 3
    assert (done.status, done.attempt) == (JobStatus.SUCCEEDED, 1)

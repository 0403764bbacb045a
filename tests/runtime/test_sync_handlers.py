"""Sync handlers (`def handler(ctx)`) run in worker threads, so a handler that
computes without awaiting leaves the event loop free for every other job and
RPC; and an async handler that blocks the loop is noticed and logged."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from leasehold._server.clock import SystemClock
from leasehold._server.jobs import state_machine
from leasehold._server.jobs.errors import LeaseLost
from leasehold._server.jobs.records import JobStatus, JsonObject
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.worker import HandlerRegistry, JobContext, SyncJobContext
from tests.runtime.helpers import enqueue, running, wait_for_terminal
from tests.support import OWNER, test_registry

# A bound on waits that only a broken runtime reaches.
PATIENCE_SECONDS = 20.0
SLOTS = RuntimeSettings(concurrency=4, poll_seconds=0.05, lease_seconds=6)


def _registry(kind: str, handler: object) -> HandlerRegistry:
    registry = test_registry()
    registry.register(kind, handler)  # type: ignore[arg-type]
    return registry


async def test_a_sync_handler_appends_events_and_returns_a_result_in_a_thread(
    live_repository: JobRepository,
) -> None:
    threads: list[str] = []

    def double(ctx: SyncJobContext) -> JsonObject:
        threads.append(threading.current_thread().name)
        ctx.raise_if_cancelled()
        event = ctx.append_event("progress", {"step": 1})
        assert event.sequence > 0
        return {"doubled": ctx.payload["n"] * 2, "attempt": ctx.attempt}

    async with running(live_repository, _registry("test.double", double), SystemClock()):
        job = await enqueue(live_repository, "test.double", {"n": 21})
        done = await wait_for_terminal(live_repository, job.id)
        events = await live_repository.list_events(OWNER, job.id, 0, 100)

    assert done.status is JobStatus.SUCCEEDED
    assert done.result == {"doubled": 42, "attempt": 1}
    assert [e.type for e in events] == ["job.queued", "job.started", "progress", "job.succeeded"]
    assert threads and threads[0] != threading.main_thread().name


async def test_async_jobs_finish_while_a_sync_handler_computes(live_repository: JobRepository) -> None:
    """Progress, not time: the echo jobs finish while the spinning handler is
    still spinning (it spins until the test says stop, or for a long while),
    which a blocked event loop could not let happen."""
    spinning = threading.Event()
    stop = threading.Event()
    spins: list[int] = []

    def spin(ctx: SyncJobContext) -> None:
        spinning.set()
        deadline = time.monotonic() + PATIENCE_SECONDS
        count = 0
        while not stop.is_set() and time.monotonic() < deadline:
            count += sum(range(1000))  # pure Python, holding the GIL between switches
        spins.append(count)

    async with running(live_repository, _registry("test.spin", spin), SystemClock(), SLOTS):
        spinner = await enqueue(live_repository, "test.spin")
        async with asyncio.timeout(PATIENCE_SECONDS):
            while not spinning.is_set():
                await asyncio.sleep(0.01)
        echoes = [await enqueue(live_repository, "example.echo", {"i": i}) for i in range(5)]
        finished = [await wait_for_terminal(live_repository, job.id) for job in echoes]
        still_spinning = not spins
        stop.set()
        spun = await wait_for_terminal(live_repository, spinner.id)

    assert still_spinning, "the async jobs only finished once the sync handler had stopped"
    assert [job.status for job in finished] == [JobStatus.SUCCEEDED] * 5
    assert spun.status is JobStatus.SUCCEEDED


async def test_a_sync_handler_sees_a_cancel_at_raise_if_cancelled(live_repository: JobRepository) -> None:
    started = threading.Event()
    cancel_sent = threading.Event()
    saw: list[str] = []

    def wait_then_check(ctx: SyncJobContext) -> None:
        ctx.raise_if_cancelled()  # nothing requested yet
        started.set()
        cancel_sent.wait(PATIENCE_SECONDS)
        try:
            ctx.raise_if_cancelled()
        except BaseException as exc:
            saw.append(type(exc).__name__)
            raise

    async with running(live_repository, _registry("test.wait", wait_then_check), SystemClock()):
        job = await enqueue(live_repository, "test.wait")
        async with asyncio.timeout(PATIENCE_SECONDS):
            while not started.is_set():
                await asyncio.sleep(0.01)
        await live_repository.cancel(OWNER, job.id)
        cancel_sent.set()
        done = await wait_for_terminal(live_repository, job.id)

    assert saw == ["JobCancelled"]
    assert done.status is JobStatus.CANCELLED


async def test_a_sync_handler_past_its_timeout_is_fenced_off(live_repository: JobRepository) -> None:
    """The thread cannot be stopped: the attempt fails with the timeout text, and
    what the thread writes afterwards is refused by the lease fence."""
    finished = threading.Event()
    after: list[str] = []

    def overrun(ctx: SyncJobContext) -> JsonObject:
        finished.wait(PATIENCE_SECONDS)
        try:
            ctx.append_event("late", {})
        except LeaseLost:
            after.append("LeaseLost")
        return {"too": "late"}

    async with running(live_repository, _registry("test.overrun", overrun), SystemClock()):
        job = await enqueue(live_repository, "test.overrun", timeout_seconds=1, max_attempts=1)
        done = await wait_for_terminal(live_repository, job.id)
        finished.set()
        async with asyncio.timeout(PATIENCE_SECONDS):
            while not after:
                await asyncio.sleep(0.01)
        events = await live_repository.list_events(OWNER, job.id, 0, 100)

    assert done.status is JobStatus.FAILED
    assert done.error_message == state_machine.TIMEOUT_ERROR_TEXT
    assert done.result is None
    assert after == ["LeaseLost"]
    assert "late" not in [e.type for e in events]


def _generator(ctx: SyncJobContext) -> Iterator[None]:
    yield None


async def _async_generator(ctx: JobContext):  # type: ignore[no-untyped-def]
    yield None


class _NotAHandler:
    def __init__(self, ctx: object) -> None:
        self.ctx = ctx


@pytest.mark.parametrize("handler", [42, "module.function", None, _generator, _async_generator, _NotAHandler])
def test_registering_what_is_not_a_handler_raises(handler: object) -> None:
    with pytest.raises(ValueError, match="must be an async def handler"):
        HandlerRegistry().register("a.kind", handler)  # type: ignore[arg-type]


def test_the_registry_tells_sync_handlers_from_async_ones() -> None:
    async def async_handler(ctx: JobContext) -> None:
        return None

    def sync_handler(ctx: SyncJobContext) -> None:
        return None

    class AsyncCallable:
        async def __call__(self, ctx: JobContext) -> None:
            return None

    registry = HandlerRegistry()
    registry.register("a.async", async_handler)
    registry.register("a.sync", sync_handler)
    registry.register("a.callable", AsyncCallable())

    assert [registry.is_sync(kind) for kind in ("a.async", "a.sync", "a.callable")] == [False, True, False]


async def test_a_sync_handler_that_returns_a_coroutine_fails_plainly(live_repository: JobRepository) -> None:
    async def inner() -> None:
        return None

    registry = _registry("test.lambda", lambda ctx: inner())
    async with running(live_repository, registry, SystemClock()):
        job = await enqueue(live_repository, "test.lambda", max_attempts=3)
        done = await wait_for_terminal(live_repository, job.id)

    assert done.status is JobStatus.FAILED
    assert done.attempt == 1  # not retried: the registration is wrong
    assert "register an async def handler" in (done.error_message or "")


async def test_an_async_handler_that_blocks_the_loop_is_logged(live_repository: JobRepository) -> None:
    async def blocker(ctx: JobContext) -> None:
        time.sleep(1.0)  # four times the threshold: the mistake this warns of

    with capture_logs() as logs:
        async with running(live_repository, _registry("test.blocker", blocker), SystemClock()):
            job = await enqueue(live_repository, "test.blocker")
            done = await wait_for_terminal(live_repository, job.id)

    blocked = [r for r in logs if r["event"] == "runtime.loop_blocked"]
    assert done.status is JobStatus.SUCCEEDED
    assert len(blocked) == 1, blocked  # rate-limited: one stall, one warning
    assert blocked[0]["log_level"] == "warning"
    assert blocked[0]["kinds"] == ["test.blocker"]
    assert blocked[0]["blocked_ms"] >= 250

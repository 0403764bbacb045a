"""In-process handlers' checkpoints: `ctx.checkpoint(state)` stores how far an
attempt got, and the next attempt starts from it in `ctx.last_checkpoint`, on
every engine, for async and sync handlers alike."""

from __future__ import annotations

import asyncio

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import JobStatus, JsonObject
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.worker import HandlerRegistry, JobContext, LeaseLost, SyncJobContext
from tests.runtime.helpers import enqueue, running, wait_for_terminal
from tests.support import OWNER

KIND = "test.pages"
SETTINGS = RuntimeSettings(concurrency=1, poll_seconds=0.05, lease_seconds=6)


class Pages:
    """A handler copying pages: it resumes at the checkpoint's page, saves one
    after each page, and the first attempt dies after page 2."""

    def __init__(self) -> None:
        self.began_at: list[JsonObject | None] = []
        self.copied: list[int] = []

    def start(self, last: JsonObject | None) -> int:
        self.began_at.append(last)
        return 0 if last is None else int(last["next_page"])

    def copy(self, page: int, attempt: int) -> None:
        if attempt == 1 and page == 2:
            raise RuntimeError("the disk went away")
        self.copied.append(page)

    def registry(self, sync: bool) -> HandlerRegistry:
        async def run_async(ctx: JobContext) -> None:
            for page in range(self.start(ctx.last_checkpoint), ctx.payload["pages"]):
                self.copy(page, ctx.attempt)
                await ctx.checkpoint({"next_page": page + 1})

        def run_sync(ctx: SyncJobContext) -> None:
            for page in range(self.start(ctx.last_checkpoint), ctx.payload["pages"]):
                self.copy(page, ctx.attempt)
                ctx.checkpoint({"next_page": page + 1})

        registry = HandlerRegistry()
        registry.register(KIND, run_sync if sync else run_async)
        return registry


async def until_retry_is_scheduled(repository: JobRepository, job_id: str) -> None:
    async with asyncio.timeout(15):
        with repository.changes.watch_job(job_id) as changed:
            while True:
                changed.take()
                job = await repository.get(OWNER, job_id)
                if job.status is JobStatus.QUEUED and job.attempt == 1:
                    return
                await changed.wait()


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_handler_that_checkpoints_then_fails_resumes_there_on_attempt_two(
    repository: JobRepository, clock: ManualClock, sync: bool
) -> None:
    pages = Pages()
    async with running(repository, pages.registry(sync), clock, SETTINGS):
        job = await enqueue(repository, KIND, {"pages": 4})
        await until_retry_is_scheduled(repository, job.id)
        clock.advance(60)  # past the retry's backoff
        done = await wait_for_terminal(repository, job.id)

    assert done.status is JobStatus.SUCCEEDED and done.attempt == 2
    assert pages.began_at == [None, {"next_page": 2}]
    assert pages.copied == [0, 1, 2, 3]  # pages 0 and 1 were not copied again


async def test_a_bad_checkpoint_raises_in_the_handler_and_saves_nothing(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository, KIND)
    claimed = (await repository.claim("w1", 1, 6)).jobs[0]
    ctx = JobContext(
        job_id=claimed.job.id,
        owner_id=OWNER,
        kind=KIND,
        payload=claimed.payload,
        attempt=1,
        _lease=claimed.lease,
        _repository=repository,
        _lease_seconds=6,
    )

    with pytest.raises(InvalidArgument, match="checkpoint"):
        await ctx.checkpoint({"bad": float("nan")})
    clock.advance(7)
    with pytest.raises(LeaseLost):
        await ctx.checkpoint({"late": True})

    assert (await repository.claim("w2", 1, 6)).jobs[0].checkpoint is None

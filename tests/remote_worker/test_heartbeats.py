"""One heartbeat loop per worker process: batched renewals, cancels and lost
leases reaching the handler through the same JobContext as in-process."""

from __future__ import annotations

import asyncio
import time

import grpc

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import LeaseLost, StorageUnavailable
from leasehold._server.jobs.records import JsonObject
from leasehold._server.remote.convert import claimed_from_proto
from leasehold._server.remote.heartbeats import LeaseBook
from leasehold.v1 import worker_pb2
from leasehold.worker import HandlerRegistry, JobCancelled, JobContext
from tests.remote_worker.fake_server import FakeWorkerService, fake_server, running_worker


def _registry(kind: str, handler: object) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(kind, handler)  # type: ignore[arg-type]
    return registry


async def test_five_running_jobs_share_one_heartbeat_call_per_interval() -> None:
    release = asyncio.Event()
    running: set[str] = set()
    all_running = asyncio.Event()

    async def wait_for_release(ctx: JobContext) -> None:
        running.add(ctx.job_id)
        if len(running) == 5:
            all_running.set()
        await release.wait()

    async with fake_server() as (service, address):
        async with running_worker(address, _registry("test.wait", wait_for_release), concurrency=5):
            job_ids = {await service.enqueue("test.wait") for _ in range(5)}
            async with asyncio.timeout(10):
                await all_running.wait()
            first, started = len(service.named("Heartbeat")), time.monotonic()
            await service.until(lambda: len(service.named("Heartbeat")) >= first + 3)
            elapsed, sent = time.monotonic() - started, len(service.named("Heartbeat")) - first
            release.set()
            await service.until(lambda: len(service.named("Complete")) == 5)
    # The beat in flight when the fifth job started may predate its claim; every
    # later one carried all five leases in one call, where five jobs heartbeating
    # on their own would have sent five calls per interval, one lease each.
    beats = service.named("Heartbeat")[first + 1 : first + 3]
    assert [{lease.job_id for lease in beat.request.leases} for beat in beats] == [job_ids, job_ids]
    # And no more than one call per interval: a sleep only ever runs long.
    assert sent <= elapsed / service.heartbeat_interval_seconds + 1


async def test_a_cancel_in_a_heartbeat_reply_reaches_raise_if_cancelled() -> None:
    checks = 0

    async def cancellable(ctx: JobContext) -> None:
        nonlocal checks
        while True:
            checks += 1
            await ctx.raise_if_cancelled()
            await asyncio.sleep(0.01)

    async with fake_server() as (service, address):
        async with running_worker(address, _registry("test.cancellable", cancellable)):
            job_id = await service.enqueue("test.cancellable")
            await service.until(lambda: len(service.named("Heartbeat")) >= 1)
            service.cancel_requested.add(job_id)
            await service.until(lambda: bool(service.named("ConfirmCancel")))
    assert [call.method for call in service.writes()] == ["ConfirmCancel"]
    # The checks asked the batched state, not the server: no call per check.
    assert checks > len(service.named("Heartbeat"))


async def test_a_lost_lease_cancels_the_handler_and_nothing_more_is_written() -> None:
    stopped = asyncio.Event()

    async def long_running(ctx: JobContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise

    async with fake_server() as (service, address):
        async with running_worker(address, _registry("test.long", long_running)):
            job_id = await service.enqueue("test.long")
            await service.until(lambda: len(service.named("Heartbeat")) >= 1)
            service.lost.add(job_id)
            beats_at_loss = len(service.named("Heartbeat"))
            async with asyncio.timeout(10):
                await stopped.wait()
        # The worker stopped with no grace: an attempt still running would have
        # been snoozed, a write the lost lease forbids.
    assert service.writes() == []
    renewing = [
        beat for beat in service.named("Heartbeat") if job_id in {ref.job_id for ref in beat.request.leases}
    ]
    assert len(renewing) <= beats_at_loss + 1  # at most the beat in flight when it was lost


async def test_a_handler_that_raises_job_cancelled_from_the_state_ends_cancelled() -> None:
    async def gives_up(ctx: JobContext) -> JsonObject:
        raise JobCancelled(ctx.job_id)

    async with fake_server() as (service, address):
        async with running_worker(address, _registry("test.gives-up", gives_up)):
            await service.enqueue("test.gives-up")
            await service.until(lambda: bool(service.writes()))
    assert [call.method for call in service.writes()] == ["ConfirmCancel"]


async def test_renewals_answer_from_the_last_beat_and_a_lapsed_lease_is_lost() -> None:
    clock = ManualClock()
    service = FakeWorkerService()
    async with fake_server(service) as (_, address):
        async with grpc.aio.insecure_channel(address) as channel:
            from leasehold.v1 import worker_pb2_grpc

            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            metadata = (("authorization", "Bearer nope"),)
            book = LeaseBook(
                lambda request, timeout: stub.Heartbeat(request, metadata=metadata, timeout=timeout), clock
            )
            await service.enqueue("test.any")
            message: worker_pb2.ClaimedJob = service.queued[0]
            claimed = claimed_from_proto(message)
            book.hold(claimed, 0.05)
            assert book.renewed(claimed.lease) == claimed.lease_expires_at  # no call made
            await book.beat_once()  # refused (wrong token): the renewal is in doubt
            try:
                book.renewed(claimed.lease)
                raise AssertionError("expected StorageUnavailable")
            except StorageUnavailable:
                pass
            clock.advance((claimed.lease_expires_at - clock.now()).total_seconds())
            try:
                book.renewed(claimed.lease)
                raise AssertionError("expected LeaseLost")
            except LeaseLost:
                pass


async def test_a_job_handed_over_with_little_lease_left_is_renewed_at_once() -> None:
    """A job whose lease runs out before the next regular beat (it waited in a
    slow network, or this process was frozen while its long poll was answered)
    is renewed at once; one with its lease whole waits for the regular beat."""
    started: dict[str, asyncio.Event] = {"whole": asyncio.Event(), "short": asyncio.Event()}
    release = asyncio.Event()

    async def hold(ctx: JobContext) -> None:
        started[ctx.payload["which"]].set()
        await release.wait()

    # The regular beat is far away: 30 s, three times the longest wait below.
    service = FakeWorkerService(heartbeat_interval_seconds=30.0)
    async with fake_server(service) as (service, address):
        async with running_worker(address, _registry("test.hold", hold), concurrency=2):
            whole = await service.enqueue("test.hold", {"which": "whole"})
            async with asyncio.timeout(10):
                await started["whole"].wait()
            assert service.named("Heartbeat") == []  # a whole lease: no beat yet

            short = await service.enqueue("test.hold", {"which": "short"}, lease_seconds=5.0)
            await service.until(lambda: bool(service.named("Heartbeat")))
            (beat,) = service.named("Heartbeat")
            assert short in {lease.job_id for lease in beat.request.leases}
            release.set()
            await service.until(lambda: len(service.named("Complete")) == 2)
    assert whole != short


async def test_a_slot_is_free_once_its_handler_stops_before_the_outcome_is_answered() -> None:
    """As in process: the claim for a freed slot travels while the outcome is
    written, not after its answer; the finishing lease is still renewed but no
    longer named in a Claim's held leases."""
    ran: list[str] = []

    async def quick(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    answers = asyncio.Event()
    service = FakeWorkerService(complete_answers=answers)
    async with fake_server(service) as (service, address):
        async with running_worker(address, _registry("test.quick", quick), concurrency=1):
            first = await service.enqueue("test.quick")
            await service.until(lambda: len(service.named("Complete")) == 1)
            second = await service.enqueue("test.quick")
            # The first Complete is still unanswered, and the one slot took the next job.
            await service.until(lambda: len(service.named("Complete")) == 2)
            assert ran == [first, second]
            later_claims = service.named("Claim")[1:]
            assert later_claims and all(
                first not in {lease.job_id for lease in claim.request.held_leases} for claim in later_claims
            )
            answers.set()

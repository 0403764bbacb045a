"""A claim that waits for work: what a remote worker's `Claim` does.

It is woken by the same change notifications that wake the in-process
runtime (a commit another replica announces, a lease this process recovered);
a write of this process that makes work (an Enqueue here) claims for it in its
own commit, as for the idle runtime. Otherwise it sleeps until the next moment something can
become claimable (a retry falling due, a lease expiring) or the safety-net poll,
whichever comes first: it never sleeps in a loop to find out.

A worker may name the attempts it already holds (protocol 2's
`held_leases`): a cancel request for one of them, or its lease being lost,
ends the wait at once with that news, so a worker busy long-polling learns of
a cancel when it happens rather than at its next heartbeat. The poll listens
for those jobs' lifecycle changes (ChangeHub.watch_lifecycles) and reads their
leases again only when one may have changed.

A poll that its caller abandons takes no job with it: a claim whose caller went
away while it was being written hands its jobs back at once (queued again, the
attempt not counted), rather than leaving them leased to no one until the
lease runs out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from leasehold._server.clock import Clock
from leasehold._server.jobs.errors import LeaseLost, ServerDraining, StorageFull, StorageUnavailable
from leasehold._server.jobs.records import ClaimedJob, ClaimResult, Lease
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.runtime.rescuer import log_lease_expired

log = structlog.get_logger("leasehold.worker_service")


@dataclass(frozen=True)
class ClaimRequest:
    worker_id: str
    kinds: KindFilter
    limit: int
    wait_seconds: float
    # Attempts the worker holds: news of them ends the wait.
    held: tuple[Lease, ...] = ()


@dataclass(frozen=True)
class HeldNews:
    """What became of one held attempt: its owner asked it to stop, or its
    lease is gone (expired, recovered, or ended by a cancel's grace)."""

    job_id: str
    cancel_requested: bool
    lost: bool


@dataclass(frozen=True)
class ClaimOutcome:
    jobs: list[ClaimedJob]
    # Only the held attempts with news, in the order they were named.
    held: list[HeldNews]


NOTHING: ClaimOutcome = ClaimOutcome([], [])


class LongPollClaimer:
    def __init__(
        self, repository: JobRepository, clock: Clock, lease_seconds: float, poll_seconds: float
    ) -> None:
        self._repository = repository
        self._clock = clock
        self._lease_seconds = lease_seconds
        self._poll_seconds = poll_seconds
        # The wake-ups of the polls now waiting, so that drain() can end them.
        self._waiting: set[asyncio.Event] = set()
        self._draining = False
        self._asleep = 0

    @property
    def waiting(self) -> int:
        """Polls now asleep until work comes (past their first look)."""
        return self._asleep

    def drain(self) -> None:
        """The server is shutting down: polls in progress return empty at once, and
        new ones are refused (UNAVAILABLE, so the worker backs off and finds another
        replica rather than asking this one again in a loop)."""
        self._draining = True
        for wake in self._waiting:
            wake.set()

    async def claim(self, request: ClaimRequest) -> ClaimOutcome:
        """Up to `request.limit` jobs, as soon as any can be claimed, or news
        of a held attempt as soon as there is some; nothing once the wait is
        over, or once the server drains."""
        if self._draining:
            raise ServerDraining("claim again once it is back (or from any replica)")
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + request.wait_seconds
        held_changed = asyncio.Event()
        held_changed.set()  # look at the held attempts once before anything else
        changes = self._repository.changes
        with changes.watch_work() as wake:
            # A held attempt's change ends the sleep (wake) and says why (held_changed).
            with changes.watch_lifecycles(_job_ids(request.held), held_changed, wake):
                self._waiting.add(wake)
                try:
                    return await self._poll(request, wake, held_changed, loop.time, give_up_at)
                finally:
                    self._waiting.discard(wake)

    async def _poll(
        self,
        request: ClaimRequest,
        wake: asyncio.Event,
        held_changed: asyncio.Event,
        now: Callable[[], float],
        give_up_at: float,
    ) -> ClaimOutcome:
        asleep_before = False
        while True:
            # Cleared before looking: a commit after this point sets it
            # again, so no wake-up can fall between the claim and the wait.
            wake.clear()
            if request.held and held_changed.is_set():
                held_changed.clear()
                news = await self._held_news(request.held)
                if news:
                    return ClaimOutcome([], news)
            result = await self._claim_once(request)
            if result.jobs:
                return ClaimOutcome(result.jobs, [])
            remaining = give_up_at - now()
            if remaining <= 0 or self._draining:
                return NOTHING
            delay = min(remaining, self._poll_seconds)
            if result.next_wakeup_at is not None:
                until_due = (result.next_wakeup_at - self._clock.now()).total_seconds()
                delay = min(delay, max(0.0, until_due))
            # Meanwhile the next write of this process that makes work claims
            # in its own commit; any other wake-up gives that up for a claim
            # of its own.
            if not asleep_before:  # once a poll: the safety net wakes it every poll_seconds
                asleep_before = True
                log.debug(
                    "worker.claim_waiting", worker_id=request.worker_id, wait_seconds=round(remaining, 3)
                )
            self._asleep += 1
            try:
                waited = await self._repository.claim_with_next_work(
                    request.worker_id, request.limit, self._lease_seconds, request.kinds, wake, delay
                )
            finally:
                self._asleep -= 1
            if waited is not None:
                log_lease_expired(waited.expired_job_ids)
                if waited.jobs:
                    return ClaimOutcome(waited.jobs, [])
            if self._draining:
                return NOTHING

    async def _held_news(self, held: tuple[Lease, ...]) -> list[HeldNews]:
        """The held attempts whose cancel was requested or whose lease is gone:
        one batched read (the repository's cancel checks share it)."""
        answers = await asyncio.gather(
            *(self._repository.cancel_requested(lease) for lease in held), return_exceptions=True
        )
        news = []
        for lease, answer in zip(held, answers, strict=True):
            if isinstance(answer, LeaseLost):
                news.append(HeldNews(lease.job_id, cancel_requested=False, lost=True))
            elif isinstance(answer, BaseException):
                raise answer
            elif answer:
                news.append(HeldNews(lease.job_id, cancel_requested=True, lost=False))
        return news

    async def _claim_once(self, request: ClaimRequest) -> ClaimResult:
        claim = asyncio.ensure_future(
            self._repository.claim(request.worker_id, request.limit, self._lease_seconds, request.kinds)
        )
        try:
            result = await asyncio.shield(claim)
        except asyncio.CancelledError:
            # The caller went away mid-claim. The write goes on regardless (the
            # storage writer commits it or not on its own): wait for it, then
            # hand back whatever it took.
            await asyncio.shield(self._hand_back(claim))
            raise
        log_lease_expired(result.expired_job_ids)
        return result

    async def _hand_back(self, claim: asyncio.Future[ClaimResult]) -> None:
        try:
            result = await claim
        except Exception:
            return  # nothing was claimed
        log_lease_expired(result.expired_job_ids)
        await self.hand_back(result.jobs)

    async def hand_back(self, jobs: list[ClaimedJob]) -> None:
        """Release jobs claimed for a caller that will never receive them."""
        for claimed in jobs:
            try:
                await self._repository.release(claimed.lease)
                log.info("worker.claim_abandoned", job_id=claimed.job.id, kind=claimed.job.kind)
            except (LeaseLost, StorageUnavailable, StorageFull) as exc:
                # Not handed back: its lease expires and the rescuer recovers it.
                log.warning("worker.hand_back_failed", job_id=claimed.job.id, error_class=type(exc).__name__)


def _job_ids(leases: tuple[Lease, ...]) -> list[str]:
    return [lease.job_id for lease in leases]

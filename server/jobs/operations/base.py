"""What every operation above the engines shares: the engine's units of work
(`EngineBase`), a write many callers make at once (`Many`), and writing a
transition's events (`EngineBase._written`).

Operations that many callers make at once (enqueues without a resource key,
successes, heartbeats, progress events) are written over a list of callers:
an engine that batches writes runs every caller of a batch in one statement;
the in-memory engine runs a list of one."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from leasehold._server.clock import Clock
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs import steering
from leasehold._server.jobs.admin import AdminFilter
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.operations import feed
from leasehold._server.jobs.operations.rows import Columns, Rows
from leasehold._server.jobs.records import (
    JobEvent,
)

T = TypeVar("T")
ItemT = TypeVar("ItemT")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Many(Generic[ItemT, T]):
    """One operation that many callers may ask for at once: `run` gets every
    caller's item and answers each with its result or the exception to raise to
    that caller (an answer: the others' writes stand)."""

    name: str
    run: Callable[[Rows, list[ItemT]], list[T | Exception]]


class Waiting(Protocol[T_co]):
    """A unit of work waiting for the next write that makes work claimable."""

    async def result(self) -> T_co: ...

    async def withdraw(self) -> T_co | None:
        """Stop waiting: None if it had not run; else what it returned (or raised)."""
        ...


def rounds(items: Sequence[ItemT], job_id: Callable[[ItemT], str]) -> Iterator[dict[str, tuple[int, ItemT]]]:
    """`items` (with their places) in rounds holding at most one item per job.
    Two leases on one job (a stale one and perhaps the valid one, or two
    appends of one handler) go in separate statements: a changed row cannot
    say whose lease changed it, and one UPDATE changes a row once."""
    waiting = list(enumerate(items))
    while waiting:
        this_round: dict[str, tuple[int, ItemT]] = {}
        later: list[tuple[int, ItemT]] = []
        for index, item in waiting:
            key = job_id(item)
            if key in this_round:
                later.append((index, item))
            else:
                this_round[key] = (index, item)
        yield this_round
        waiting = later


def enqueue_events(job_id: str, now: datetime) -> list[JobEvent]:
    return [JobEvent(job_id, sequence, event_type, {}, now) for sequence, event_type in sm.enqueue_events()]


class EngineBase(ABC):
    """What every operation shares: the clock, the steering rules and the
    engine's units of work (`_write`, `_write_many`, `_sweep`,
    `_write_on_next_work`), which an engine provides."""

    def __init__(
        self,
        clock: Clock,
        changes: ChangeHub | None,
        steering_rules: steering.Steering,
        jitter: Callable[[], float],
        max_events_per_job: int | None,
    ) -> None:
        """`max_events_per_job`: append_event refuses a job whose log holds that many
        events (its lifecycle events included, which are never refused); None: no limit."""
        self._clock = clock
        self._changes = changes or ChangeHub()
        self._steering = steering_rules
        self._jitter = jitter
        self._max_events = max_events_per_job
        # Where the turn-taking among owners with nothing running goes on
        # (steering.choose); this process's own, which is all fairness needs.
        self._fair_share_cursor = ""
        # The time of the last committed claim; None until the first. See _claim_op.
        self._claim_clock_high_water: datetime | None = None

    @property
    def changes(self) -> ChangeHub:
        return self._changes

    @property
    def steering(self) -> steering.Steering:
        return self._steering

    # ----- what an engine provides -------------------------------------------------------

    @abstractmethod
    async def _write(self, op: Callable[[Rows], T]) -> T:
        """Run `op` in a unit of work of its own (or a savepoint of a shared
        one): what it writes commits whole, or not at all if it raises."""

    @abstractmethod
    async def _write_many(self, many: Many[ItemT, T], item: ItemT) -> T:
        """`many` for `item`, together with whichever other callers' items
        the engine gathers; raises the exception `many` answered with."""

    async def _sweep(self, op: Callable[[Rows], T]) -> T:
        """`_write`, for retention's deletes and bulk batches: an engine may
        run them apart from the claims' writes."""
        return await self._write(op)

    @abstractmethod
    def _write_on_next_work(self, op: Callable[[Rows], T]) -> Waiting[T]:
        """Run `op` in the next write of this process that makes work
        claimable, in that write's unit of work."""

    @abstractmethod
    async def _next_fire_at(self) -> datetime | None:
        """The earliest next fire time of any schedule (a read)."""

    @abstractmethod
    async def _bulk_preview(
        self, job_filter: AdminFilter, below: int | None, limit: int, unretried: bool
    ) -> list[Columns]:
        """`Rows.bulk_batch` as a read that locks nothing (a dry run)."""

    def _watch_other_writers(self) -> None:  # noqa: B027 - most engines have no feed
        """Called before a claim waits on the change hub: an engine whose
        other processes' commits arrive by a feed starts it here."""

    # ----- after a transition -------------------------------------------------------------

    def _written(
        self, rows: Rows, transition: sm.Transition, changed: Sequence[Columns], now: datetime
    ) -> None:
        """Write the events of the branch each changed row took, and wake the
        claimers when one of them made work claimable."""
        events: list[JobEvent] = []
        wake = False
        ended: dict[str, str] = {}
        for row in changed:
            branch = transition.branch_for(row["status"])
            events.extend(
                JobEvent(row["id"], sequence, event_type, payload, now)
                for sequence, event_type, payload in sm.lifecycle_events(branch, row)
            )
            wake = wake or sm.wakes_claimers(transition, branch, self._steering.limits_running)
            if row["has_dependents"] and branch.status.is_terminal:
                ended[row["id"]] = branch.status.value
        if events:
            rows.insert_events(events, feed.subjects_of(changed))
        if wake:
            rows.announce_work()
        if ended:
            self._settle_children(rows, ended, now)

    @abstractmethod
    def _settle_children(self, rows: Rows, ended: dict[str, str], now: datetime) -> None:
        """Carry the endings of jobs some job waits on to their children
        (`GraphOperations`)."""

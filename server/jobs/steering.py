"""What is claimed next, and what holds a job back: the claim order and limits of
DESIGN §11, decided here once for every engine.

The order: due jobs only; then priority (1 before 2 ... before 5, and a
priority whose jobs are all held back by limits lets the next one go); then
fair share across owners; then oldest first within an owner
(`state_machine.CLAIM_ORDER`). Fair share: the next slot goes to the owner with
the fewest running jobs for its weight, counting the jobs this claim already
picked, so slots are dealt out one at a time. Owners that tie (every owner
with nothing running ties at zero) take turns in the order of their ids,
starting after the last owner that was dealt a slot from zero, so no owner is
always first. An owner's share is counted in jobs, never in kinds or resource
keys, so spreading work over them gains nothing.

Limits hold across every process sharing the database: the running counts
come from the database's live leases (an expired lease holds no slot), and
each engine runs a claim so that no two claims decide from the same counts
(SQLite's one writer; PostgreSQL's lock taken by every claim while limits are
set). A held-back job simply stays queued.

Engines answer the questions of `QueueView`, inside the claim's transaction;
`choose` asks them and decides. Nothing here knows SQL.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from leasehold._server.jobs.records import Job, WaitReason

DEFAULT_WEIGHT = 1.0
# The most owners one step of a claim's scan asks for.
MAX_SCAN_STEP = 1024


@dataclass(frozen=True)
class Rate:
    """A token bucket on starts: `per_second` tokens a second, holding at most `burst`."""

    per_second: float
    burst: int


@dataclass(frozen=True)
class Steering:
    """The limits and weights a service was started with (`serve --kind-limit`,
    `--owner-limit`, `--owner-weight`, `--kind-rate`)."""

    kind_limits: Mapping[str, int] = field(default_factory=dict)
    owner_limit: int | None = None
    owner_weights: Mapping[str, float] = field(default_factory=dict)
    kind_rates: Mapping[str, Rate] = field(default_factory=dict)

    @property
    def limits_running(self) -> bool:
        """Whether a job ending can let a held-back job start (so an ended
        attempt must wake idle claimers, as new work does)."""
        return bool(self.kind_limits) or self.owner_limit is not None

    @property
    def has_limits(self) -> bool:
        """Whether claims must decide one at a time, across processes too."""
        return self.limits_running or bool(self.kind_rates)

    def weight(self, owner_id: str) -> float:
        return self.owner_weights.get(owner_id, DEFAULT_WEIGHT)

    def describe(self) -> dict[str, object]:
        """For the start-up log line (owner ids are the operator's own settings)."""
        return {
            "kind_limits": dict(self.kind_limits),
            "owner_limit": self.owner_limit,
            "owner_weights": dict(self.owner_weights),
            "kind_rates": {kind: f"{r.per_second:g}/s:{r.burst}" for kind, r in self.kind_rates.items()},
        }


NO_STEERING = Steering()


@dataclass(frozen=True)
class Running:
    """Live leases, counted per owner and per kind."""

    by_owner: Mapping[str, int]
    by_kind: Mapping[str, int]


@dataclass(frozen=True)
class Head:
    """A claimable job at the head of an owner's queue, and its place in the
    claim order (the engine's `state_machine.CLAIM_ORDER` values)."""

    job_id: str
    kind: str
    position: tuple[object, ...]


@dataclass(frozen=True)
class Bucket:
    tokens: float
    refilled_at: datetime


def refill(bucket: Bucket | None, rate: Rate, now: datetime) -> float:
    """The tokens a bucket holds at `now`. A bucket never used starts full; a
    clock that went back adds nothing."""
    if bucket is None:
        return float(rate.burst)
    elapsed = max((now - bucket.refilled_at).total_seconds(), 0.0)
    return min(float(rate.burst), bucket.tokens + elapsed * rate.per_second)


def next_token_at(tokens: float, rate: Rate, now: datetime) -> datetime:
    """When a bucket holding `tokens` next holds a whole one."""
    return now + timedelta(seconds=max(1.0 - tokens, 0.0) / rate.per_second)


def rate_wakeup(
    tokens: Mapping[str, float], spent: Mapping[str, int], rates: Mapping[str, Rate], now: datetime
) -> datetime | None:
    """When a kind whose bucket a claim left without a whole token gets its
    next one (a claimer waiting on nothing else looks again then)."""
    moments = [
        next_token_at(held - spent.get(kind, 0), rates[kind], now)
        for kind, held in tokens.items()
        if held - spent.get(kind, 0) < 1
    ]
    return min(moments, default=None)


class QueueView(Protocol):
    """What `choose` asks an engine, inside the claim's transaction. Every
    answer covers only due, queued jobs the claimer's kinds admit."""

    def running(self) -> Running: ...

    def due_priorities(self) -> list[tuple[int, str | None]]:
        """The priorities that have a due job, first to last, each with its
        one owner when a single owner has all of its due jobs (else None)."""
        ...

    def owners_with_due(self, priority: int, after: str, count: int) -> list[tuple[str, Head | None]]:
        """Up to `count` owners with a due job at `priority`, in id order,
        starting after `after` and wrapping around; none twice. Each comes with
        its oldest due job where the engine's claims never run side by side (so
        a job found is still there to take), else None."""
        ...

    def heads(
        self,
        priority: int,
        wanted: Sequence[HeadsWanted],
        blocked_kinds: frozenset[str],
    ) -> dict[str, list[Head]]:
        """For each owner in `wanted`, up to its `count` of due jobs at
        `priority`, oldest first, of no kind in `blocked_kinds`, placed after
        its `after` (None: from the start). One question for many owners,
        since a claim shared among owners deals each of them few slots."""
        ...


@dataclass(frozen=True)
class HeadsWanted:
    """One owner's part of a `QueueView.heads` question."""

    owner_id: str
    after: tuple[object, ...] | None
    count: int


@dataclass
class Choice:
    """What a claim takes, in the order dealt, and where the turn-taking goes on."""

    job_ids: list[str]
    cursor: str
    # Kind -> starts it took from its rate bucket.
    rate_spent: Counter[str]


@dataclass
class _Owner:
    """One owner's place in the deal at one priority."""

    owner_id: str
    rank: int
    cached: list[Head] = field(default_factory=list)
    last: tuple[object, ...] | None = None
    exhausted: bool = False
    # How many jobs its next read asks for: one at first when owners share the
    # slots (each is dealt few), doubling as it is dealt more.
    batch: int = 1


class _Deal:
    """The state of one claim's choice across priorities: slots left, per-owner
    and per-kind budgets, what was picked."""

    def __init__(self, steering: Steering, view: QueueView, limit: int, tokens: Mapping[str, float]) -> None:
        self.steering = steering
        self._view = view
        self._running: Running | None = None
        self.limit = limit
        self.picked: list[str] = []
        self.picked_by_owner: Counter[str] = Counter()
        self.kind_budget: dict[str, float] = {}
        for kind, kind_limit in steering.kind_limits.items():
            self.kind_budget[kind] = kind_limit - self.running.by_kind.get(kind, 0)
        for kind, held in tokens.items():
            self.kind_budget[kind] = min(self.kind_budget.get(kind, math.inf), math.floor(held))
        self.rate_spent: Counter[str] = Counter()

    @property
    def running(self) -> Running:
        """Read once, when first needed: a lone owner with no limits set needs no counts."""
        if self._running is None:
            self._running = self._view.running()
        return self._running

    @property
    def left(self) -> int:
        return self.limit - len(self.picked)

    def blocked_kinds(self) -> frozenset[str]:
        return frozenset(kind for kind, budget in self.kind_budget.items() if budget < 1)

    def share(self, owner_id: str) -> float:
        taken = self.running.by_owner.get(owner_id, 0) + self.picked_by_owner[owner_id]
        return taken / self.steering.weight(owner_id)

    def owner_full(self, owner_id: str) -> bool:
        owner_limit = self.steering.owner_limit
        if owner_limit is None:
            return False
        return self.running.by_owner.get(owner_id, 0) + self.picked_by_owner[owner_id] >= owner_limit

    def take(self, owner_id: str, head: Head) -> None:
        self.picked.append(head.job_id)
        self.picked_by_owner[owner_id] += 1
        if head.kind in self.kind_budget:
            self.kind_budget[head.kind] -= 1
        if head.kind in self.steering.kind_rates:
            self.rate_spent[head.kind] += 1


def choose(
    view: QueueView,
    steering: Steering,
    limit: int,
    cursor: str,
    tokens: Mapping[str, float],
) -> Choice:
    """The jobs a claim of up to `limit` takes, by the order above. `tokens`:
    what each rate-limited kind's bucket holds now (`refill`)."""
    if limit <= 0:
        return Choice([], cursor, Counter())
    deal = _Deal(steering, view, limit, tokens)
    for priority, lone_owner in view.due_priorities():
        if deal.left <= 0:
            break
        if lone_owner is not None and not steering.has_limits:
            cursor = _deal_lone_owner(view, deal, priority, lone_owner)
        else:
            cursor = _deal_priority(view, deal, priority, cursor)
    return Choice(deal.picked, cursor, deal.rate_spent)


def _deal_priority(view: QueueView, deal: _Deal, priority: int, cursor: str) -> str:
    """Deal the slots left among the owners with due jobs at `priority`.

    Owners with nothing running all share the lowest key (zero), so they are
    dealt first, one slot each in turn. The scan starts after the owner dealt
    a slot last, where the owners dealt longest ago (the likeliest to have
    nothing running) are; it asks for one owner more than the slots left and
    the owners running jobs together (so it usually finds enough owners with
    nothing running at once), and scans on, in growing steps, only when every
    owner found so far runs jobs already or has nothing claimable."""
    scan_size = min(deal.left + 1 + len(deal.running.by_owner), MAX_SCAN_STEP)
    found = view.owners_with_due(priority, cursor, scan_size)
    complete = len(found) < scan_size
    owners: dict[str, _Owner] = {}
    heap: list[tuple[float, int, int, str]] = []

    def admit(scanned: list[tuple[str, Head | None]]) -> int:
        added = 0
        for owner_id, head in scanned:
            if owner_id in owners:
                continue
            owners[owner_id] = _Owner(owner_id, rank=len(owners))
            if head is not None:
                owners[owner_id].cached = [head]
                owners[owner_id].last = head.position
            heapq.heappush(heap, (deal.share(owner_id), 0, owners[owner_id].rank, owner_id))
            added += 1
        return added

    admit(found)
    # Among owners that tie, those not yet dealt a slot go first, in scan order;
    # then the one dealt least recently: turns go round.
    turns = 0
    last_scanned = found[-1][0] if found else cursor
    while deal.left > 0:
        if not complete and (not heap or heap[0][0] > 0):
            # Every known owner with nothing running has had its turn or has
            # nothing claimable: there may be more such owners past the scan.
            scan_size = min(scan_size * 2, MAX_SCAN_STEP)
            more = view.owners_with_due(priority, last_scanned, scan_size)
            complete = len(more) < scan_size
            if more:
                last_scanned = more[-1][0]
            if not admit(more):
                complete = True  # the scan came round to owners already known
            continue
        if not heap:
            break
        key, turn, rank, owner_id = heapq.heappop(heap)
        if deal.owner_full(owner_id):
            continue
        owner = owners[owner_id]
        company: list[_Owner] = []
        if not owner.cached and not owner.exhausted:
            # The owners next in the deal are read with this one.
            company = [
                owners[next_id]
                for *_, next_id in heapq.nsmallest(deal.left - 1, heap)
                if not deal.owner_full(next_id)
            ]
        head = _next_head(view, deal, priority, owner, company)
        if head is None:
            continue
        cursor = owner_id  # the turn-taking goes on after this owner
        deal.take(owner_id, head)
        turns += 1
        heapq.heappush(heap, (deal.share(owner_id), turns, rank, owner_id))
    return cursor


def _deal_lone_owner(view: QueueView, deal: _Deal, priority: int, owner_id: str) -> str:
    """The only owner with due jobs at `priority`, and no limits: every slot
    left is its, whatever anyone runs."""
    owner = _Owner(owner_id, rank=0, batch=deal.left)
    while deal.left > 0:
        head = _next_head(view, deal, priority, owner)
        if head is None:
            break
        deal.take(owner_id, head)
    return owner_id


def _next_head(
    view: QueueView, deal: _Deal, priority: int, owner: _Owner, company: Sequence[_Owner] = ()
) -> Head | None:
    """The owner's oldest claimable job not yet picked, or None. When the owner
    must be read, the owners of `company` (those likely dealt next) with
    nothing cached are read by the same question."""
    while True:
        blocked = deal.blocked_kinds()
        while owner.cached:
            head = owner.cached.pop(0)
            if head.kind not in blocked:
                return head
        if owner.exhausted:
            return None
        _read_heads(view, deal, priority, [owner, *company], blocked)
        company = ()


def _read_heads(
    view: QueueView, deal: _Deal, priority: int, group: Sequence[_Owner], blocked: frozenset[str]
) -> None:
    """Refill the caches of the owners of `group` that have nothing cached, in
    one question."""
    wanted: dict[str, tuple[_Owner, HeadsWanted]] = {}
    for member in group:
        if member.cached or member.exhausted or member.owner_id in wanted:
            continue
        count = max(min(member.batch, deal.left), 1)
        member.batch = min(member.batch * 2, MAX_SCAN_STEP)
        wanted[member.owner_id] = (member, HeadsWanted(member.owner_id, member.last, count))
    found = view.heads(priority, [want for _, want in wanted.values()], blocked)
    for member, want in wanted.values():
        fetched = found.get(member.owner_id, [])
        if len(fetched) < want.count:
            member.exhausted = True
        if fetched:
            member.last = fetched[-1].position
            member.cached = fetched


# ----- why a queued job waits ---------------------------------------------------------


@dataclass(frozen=True)
class Occupancy:
    """What holds a queued job back, read at Get time only: the live leases of
    its kind and of its owner, and what its kind's bucket holds (if it has a rate)."""

    kind_running: int
    owner_running: int
    rate_tokens: float | None
    # AdminService.PauseKind holds its kind.
    paused: bool = False


def wait_reason(
    rules: Steering,
    job: Job,
    now: datetime,
    occupancy: Occupancy,
    served: bool,
) -> WaitReason:
    """Why a queued job is not running: the first of its due time, a pause of
    its kind, its limits and its workers (`served`: some worker takes its kind) that holds it back,
    else `ready` (it waits its turn in the claim order)."""
    if job.pending_dependencies:
        return WaitReason.DEPENDENCIES
    if job.available_at > now:
        return WaitReason.BACKOFF if job.attempt > 0 else WaitReason.SCHEDULED
    if occupancy.paused:
        return WaitReason.PAUSED
    kind_limit = rules.kind_limits.get(job.kind)
    if kind_limit is not None and occupancy.kind_running >= kind_limit:
        return WaitReason.KIND_LIMIT
    if rules.owner_limit is not None and occupancy.owner_running >= rules.owner_limit:
        return WaitReason.OWNER_LIMIT
    if occupancy.rate_tokens is not None and occupancy.rate_tokens < 1:
        return WaitReason.RATE_LIMIT
    if not served:
        return WaitReason.NO_WORKER
    return WaitReason.READY

"""How many distinct kinds, resource types and schedules one owner may have
(`serve --max-kinds-per-owner`, `--max-resource-types-per-owner`,
`--max-schedules-per-owner`).

Every kind an owner invents is a row of the admin's stats and, unchecked, a
series of the metrics; every resource type and schedule is state the server
keeps for them. These limits keep one owner from growing those without bound.

The checks are cheap where it matters: a request whose kinds and resource
types the owner already uses costs one index probe per field and takes no
lock. Only a value new to the owner needs a count of the owner's distinct
values, which the engine stops at the limit, so it is bounded however many
jobs the owner has. That slow path holds a per-owner lock in this process
from the count until the write is done, so calls of one owner on one replica
cannot together pass the limit. Replicas do not share the lock: N replicas
admitting new values for one owner at the same instant may each add one
request's worth, so across replicas the limit is a soft bound (overshot by at
most a batch per replica at once). Jobs retention deletes stop counting.
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

from leasehold._server.jobs.errors import LimitExceeded
from leasehold._server.jobs.records import NewJob

# A thousand of each is far more than any real application names (kinds are
# its job types, resource types the things those jobs work on), and few
# enough that the admin's stats and the metrics stay small.
DEFAULT_MAX_KINDS_PER_OWNER = 1000
DEFAULT_MAX_RESOURCE_TYPES_PER_OWNER = 1000
DEFAULT_MAX_SCHEDULES_PER_OWNER = 1000
# The flag value that switches a limit off.
UNLIMITED = 0
# (owner, field, value) triples known to exist, remembered so that an owner's
# everyday Enqueue of a kind it always uses costs no read at all. Forgetting
# one (or retention deleting its jobs meanwhile) only means one more probe, or
# a value counted as known a little longer: the limit is a soft bound anyway.
KNOWN_VALUES_REMEMBERED = 10_000


class OwnedField(enum.Enum):
    """A job column whose distinct values per owner are limited; the value is
    the column's (and the request field's) name."""

    KIND = "kind"
    RESOURCE_TYPE = "resource_type"


@dataclass(frozen=True)
class OwnerLimits:
    """The three limits; 0 switches one off."""

    max_kinds: int = DEFAULT_MAX_KINDS_PER_OWNER
    max_resource_types: int = DEFAULT_MAX_RESOURCE_TYPES_PER_OWNER
    max_schedules: int = DEFAULT_MAX_SCHEDULES_PER_OWNER

    def __post_init__(self) -> None:
        for name in ("max_kinds", "max_resource_types", "max_schedules"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}_per_owner: must be at least 0 (0: no limit)")

    def of(self, owned: OwnedField) -> tuple[str, int]:
        """The flag (without its dashes) and the value limiting `owned`."""
        if owned is OwnedField.KIND:
            return "max-kinds-per-owner", self.max_kinds
        return "max-resource-types-per-owner", self.max_resource_types


NO_LIMITS = OwnerLimits(UNLIMITED, UNLIMITED, UNLIMITED)


@dataclass(frozen=True)
class Wanted:
    """What a request would add to an owner: per limited field, each value it
    names, with the request field that first names it (for the refusal)."""

    owner_id: str
    values: dict[OwnedField, dict[str, str]] = field(default_factory=dict)
    schedule_field: str | None = None

    @classmethod
    def jobs(cls, new_jobs: Sequence[NewJob], batch: bool) -> Wanted:
        """The values of Enqueue's one job, or of a batch's items (whose
        fields are named `requests[i].kind`)."""
        values: dict[OwnedField, dict[str, str]] = {owned: {} for owned in OwnedField}
        for index, new_job in enumerate(new_jobs):
            prefix = f"requests[{index}]." if batch else ""
            values[OwnedField.KIND].setdefault(new_job.kind, f"{prefix}kind")
            if new_job.resource_type:
                values[OwnedField.RESOURCE_TYPE].setdefault(new_job.resource_type, f"{prefix}resource_type")
        return cls(new_jobs[0].owner_id if new_jobs else "", values)

    @classmethod
    def schedule(cls, owner_id: str, kind: str) -> Wanted:
        """A new schedule, whose firings will make jobs of `kind`."""
        return cls(owner_id, {OwnedField.KIND: {kind: "job.kind"}}, schedule_field="schedule_id")


class OwnedCounts(Protocol):
    """The reads the checks need: a `JobRepository` answers them on every engine."""

    async def known_values(
        self, owner_id: str, owned: OwnedField, among: Sequence[str]
    ) -> frozenset[str]: ...

    async def count_distinct(self, owner_id: str, owned: OwnedField, up_to: int) -> int: ...

    async def count_schedules(self, owner_id: str, up_to: int) -> int: ...


class OwnerQuotas:
    """Admits or refuses what a request would add to its owner (module doc)."""

    def __init__(self, counts: OwnedCounts, limits: OwnerLimits) -> None:
        self._counts = counts
        self._limits = limits
        # owner -> (its lock, how many calls hold or wait for it): an entry
        # lives only while someone uses it, so idle owners cost nothing.
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._known: OrderedDict[tuple[str, OwnedField, str], None] = OrderedDict()

    @property
    def limits(self) -> OwnerLimits:
        return self._limits

    @asynccontextmanager
    async def admitting(self, wanted: Wanted) -> AsyncIterator[None]:
        """Hold this around the write of what `wanted` describes: raises
        LimitExceeded (naming the flag and the field) when it would pass a
        limit; otherwise, if it adds anything new, keeps other calls of the
        owner that add something new waiting until the write is done."""
        if wanted.schedule_field is None and await self._nothing_new(wanted):
            yield
            return
        async with self._owner_lock(wanted.owner_id):
            await self._check(wanted)
            yield
        # Written: what was new is known now.
        for owned, named in wanted.values.items():
            self._remember(wanted.owner_id, owned, named)

    async def _nothing_new(self, wanted: Wanted) -> bool:
        for owned, named in wanted.values.items():
            if named and self._limit_of(owned) != UNLIMITED:
                known = await self._known_values(wanted.owner_id, owned, named)
                if len(known) < len(named):
                    return False
        return True

    async def _known_values(self, owner_id: str, owned: OwnedField, named: dict[str, str]) -> set[str]:
        """Which of `named` the owner's jobs already have: remembered ones
        without a read, the rest from one probe."""
        known = {value for value in named if (owner_id, owned, value) in self._known}
        for value in known:
            self._known.move_to_end((owner_id, owned, value))
        unsure = [value for value in named if value not in known]
        if unsure:
            found = await self._counts.known_values(owner_id, owned, unsure)
            self._remember(owner_id, owned, found)
            known.update(found)
        return known

    def _remember(self, owner_id: str, owned: OwnedField, values: Iterable[str]) -> None:
        for value in values:
            self._known[(owner_id, owned, value)] = None
            self._known.move_to_end((owner_id, owned, value))
        while len(self._known) > KNOWN_VALUES_REMEMBERED:
            self._known.popitem(last=False)

    async def _check(self, wanted: Wanted) -> None:
        if wanted.schedule_field is not None and self._limits.max_schedules != UNLIMITED:
            limit = self._limits.max_schedules
            have = await self._counts.count_schedules(wanted.owner_id, limit)
            if have >= limit:
                raise LimitExceeded(
                    "max-schedules-per-owner",
                    limit,
                    f"{wanted.schedule_field}: the caller already has {have} schedules",
                    field=wanted.schedule_field,
                )
        for owned, named in wanted.values.items():
            await self._check_field(wanted.owner_id, owned, named)

    async def _check_field(self, owner_id: str, owned: OwnedField, named: dict[str, str]) -> None:
        flag, limit = self._limits.of(owned)
        if not named or limit == UNLIMITED:
            return
        known = await self._known_values(owner_id, owned, named)
        new = [value for value in named if value not in known]
        if not new:
            return
        have = await self._counts.count_distinct(owner_id, owned, limit)
        if have + len(new) <= limit:
            return
        first_over = new[max(0, limit - have)]
        where = named[first_over]
        adds = f" (this request adds {len(new)})" if len(new) > 1 else ""
        raise LimitExceeded(
            flag,
            limit,
            f"{where}: {first_over!r} is a new {owned.value} for the caller, whose jobs "
            f"already have {have} distinct {owned.value}s{adds}",
            field=where,
        )

    def _limit_of(self, owned: OwnedField) -> int:
        return self._limits.of(owned)[1]

    @asynccontextmanager
    async def _owner_lock(self, owner_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(owner_id, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[owner_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[owner_id]
            if users <= 1:
                del self._locks[owner_id]
            else:
                self._locks[owner_id] = (lock, users - 1)

"""Graphs of jobs (DESIGN §18): the rules a job with parents lives by.

A child waits, queued but never claimed, until each of its parents has ended
as it waits for; it then falls due in the same commit that recorded its last
parent's ending. Under `ParentFailurePolicy.CANCEL` a parent that ends failed
or cancelled ends the child cancelled (and, through the same rule, its own
children); under `RUN` every ending counts. The operations apply these rules
(`operations.graphs`); nothing here reads or writes a row.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import JobStatus, JsonObject, ParentFailurePolicy

# At most this many parents per job (its depends_on and depends_on_refs together).
MAX_PARENTS = 100
# What a handler is handed of its parents' results, at most, in serialized
# JSON bytes: each parent result is at most 256 KiB already, but a hundred of
# them would pass gRPC's default 4 MiB message; parents beyond the bound (in
# depends_on order) are left out, and their results remain readable by Get.
PARENT_RESULTS_LIMIT_BYTES = 4 * 1024 * 1024
DEPENDENCY_FAILED_ERROR_TYPE = sm.DEPENDENCY_FAILED_ERROR_TYPE

_REF = re.compile(r"[A-Za-z0-9._-]{1,128}")


def resolve_refs(items: Sequence[tuple[str, Sequence[str], int]]) -> list[tuple[int, ...]]:
    """Each BatchEnqueue item's parents among the batch, by position, from its
    `(ref, depends_on_refs, len(depends_on))`; refused (naming the field) when a
    ref is malformed or repeated, a depends_on_ref names no item, names its own
    item or repeats, an item would have more than `MAX_PARENTS` parents, or the
    refs make a cycle."""
    positions: dict[str, int] = {}
    for index, (ref, _, _) in enumerate(items):
        if not ref:
            continue
        if not _REF.fullmatch(ref):
            raise InvalidArgument(f"requests[{index}].ref", "must be 1-128 characters of [A-Za-z0-9._-]")
        if ref in positions:
            raise InvalidArgument(f"requests[{index}].ref", f"repeats the ref of requests[{positions[ref]}]")
        positions[ref] = index
    parents: list[tuple[int, ...]] = []
    for index, (_, refs, explicit) in enumerate(items):
        if len(refs) + explicit > MAX_PARENTS:
            raise InvalidArgument(
                f"requests[{index}].depends_on_refs",
                f"with depends_on names more than {MAX_PARENTS} parents",
            )
        found: list[int] = []
        for place, ref in enumerate(refs):
            field = f"requests[{index}].depends_on_refs[{place}]"
            position = positions.get(ref)
            if position is None:
                raise InvalidArgument(field, f"names no item of this batch (no item has ref {ref!r})")
            if position == index:
                raise InvalidArgument(field, "names its own item: a job cannot depend on itself")
            if position in found:
                raise InvalidArgument(field, f"repeats {ref!r}")
            found.append(position)
        parents.append(tuple(found))
    batch_order(parents)
    return parents


def batch_order(parents: Sequence[Sequence[int]]) -> list[int]:
    """The batch's positions with every item after the items it depends on,
    and otherwise in request order (so a batch without refs keeps its order);
    refused when the refs make a cycle, naming an item on it."""
    children: list[list[int]] = [[] for _ in parents]
    waiting = [len(set(of)) for of in parents]
    for child, of in enumerate(parents):
        for parent in set(of):
            children[parent].append(child)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for child in children[index]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    if len(order) < len(parents):
        stuck = min(index for index, count in enumerate(waiting) if count > 0)
        raise InvalidArgument(f"requests[{stuck}].depends_on_refs", "makes a cycle of dependencies")
    return order


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a child stands among its parents: how many it still waits for,
    and the parent whose ending ends it (`CANCEL` policy), if one did."""

    pending: int
    failed_parent: tuple[str, str | None] | None = None  # (id, its status; None: gone)


def ended_well(status: str | None, policy: ParentFailurePolicy) -> bool | None:
    """Whether a parent in `status` (None: no longer kept) is done for a child
    of `policy`: True when it ended as the child waits for, False when its
    ending ends the child, None while it has not ended."""
    if status is not None and not JobStatus(status).is_terminal:
        return None
    if policy is ParentFailurePolicy.RUN or status == JobStatus.SUCCEEDED:
        return True
    return False


def standing(parents: Iterable[tuple[str, str | None]], policy: ParentFailurePolicy) -> Standing:
    """A new child's standing from its parents' `(id, status)` as they are now."""
    pending = 0
    for parent_id, status in parents:
        outcome = ended_well(status, policy)
        if outcome is None:
            pending += 1
        elif outcome is False:
            return Standing(pending, (parent_id, status))
    return Standing(pending)


def handed_results(depends_on: Iterable[str], results: Mapping[str, JsonObject]) -> dict[str, JsonObject]:
    """What a handler is handed of its parents' `results`: each parent's that
    has one, in `depends_on` order, while they fit in
    `PARENT_RESULTS_LIMIT_BYTES` as compact JSON; one that does not fit in what
    is left is left out (a smaller later one may still fit)."""
    kept: dict[str, JsonObject] = {}
    budget = PARENT_RESULTS_LIMIT_BYTES
    for parent in depends_on:
        result = results.get(parent)
        if result is None or parent in kept:
            continue
        size = len(json.dumps(result, separators=(",", ":")).encode())
        if size <= budget:
            budget -= size
            kept[parent] = result
    return kept

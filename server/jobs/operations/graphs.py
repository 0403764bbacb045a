"""Graphs of jobs, written once above the engines: a new job's parents looked
up and locked, its edges kept, and a parent's ending carried to its children
in the parent's own unit of work (`dependencies` holds the rules).

Every job's ending passes through `EngineBase._written`, which calls
`_settle_children` for the ended jobs that ever had a child enqueued
(`has_dependents`): jobs outside graphs pay nothing. Settling reads the
children of those parents by index, locked, so it costs O(children), and a
cascade of failures walks down one generation per round.

Why nothing is lost to a race: a child's Enqueue locks each parent row
(`Rows.lock_parents`, which also marks it `has_dependents`) before it reads the
parent's status, and a parent's ending locks the same row. Whichever commits
first, the other sees it: an Enqueue after the ending reads the final status;
an ending after the Enqueue finds the child's edge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from leasehold._server.jobs import dependencies, ids
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.operations import feed
from leasehold._server.jobs.operations.base import EngineBase, enqueue_events
from leasehold._server.jobs.operations.rows import Columns, Rows
from leasehold._server.jobs.records import (
    Job,
    JobEvent,
    JsonObject,
    NewJob,
    ParentFailurePolicy,
)

# The columns settling changes of a child, by what became of it: each write
# names only those, so an index over the others is left alone.
COUNTED_COLUMNS: tuple[str, ...] = ("pending_dependencies", "updated_at")
RELEASED_COLUMNS: tuple[str, ...] = (
    "pending_dependencies",
    "available_at",
    "last_event_sequence",
    "updated_at",
)
ENDED_COLUMNS: tuple[str, ...] = (
    "status",
    "completed_at",
    "error_message",
    "error_type",
    "pending_dependencies",
    "last_event_sequence",
    "updated_at",
)


class GraphOperations(EngineBase):
    """New jobs with parents, and their release when the parents end."""

    # ----- new children -------------------------------------------------------------------

    def _enqueue_graph(
        self, rows: Rows, new_jobs: Sequence[NewJob], now: datetime, in_batch: bool
    ) -> list[tuple[Job, bool]]:
        """`OwnerOperations._enqueue_rows` for a call in which some job has
        parents: the items are written parents first (`batch_order`), so an
        item's parents among the batch already have their ids, or their
        existing job when their resource key deduplicated them."""
        order = dependencies.batch_order([job.depends_on_items for job in new_jobs])
        # Each item's parents are its own owner's: looked up per owner, so a
        # call never names (or learns of) another owner's job.
        owned: dict[str, dict[str, str]] = {}
        for owner_id in sorted({job.owner_id for job in new_jobs}):
            named = sorted(
                {parent for job in new_jobs if job.owner_id == owner_id for parent in job.depends_on}
            )
            owned[owner_id] = rows.lock_parents(owner_id, named) if named else {}
        statuses: dict[str, str | None] = {}
        for index, job in enumerate(new_jobs):
            for place, parent in enumerate(job.depends_on):
                if parent in owned[job.owner_id]:
                    statuses[parent] = owned[job.owner_id][parent]
                else:
                    field = f"depends_on[{place}]"
                    raise InvalidArgument(
                        f"requests[{index}].{field}" if in_batch else field,
                        "names no job of the caller's",
                    )
        # Items some other item waits for are marked as parents when written.
        has_children = {parent for job in new_jobs for parent in job.depends_on_items}
        answers: dict[int, tuple[Job, bool]] = {}
        by_resource: dict[tuple[str, str, str], Job] = {}
        pending_rows: list[dict[str, Any]] = []
        written: list[dict[str, Any]] = []
        edges: list[tuple[str, str]] = []
        events: list[JobEvent] = []
        for index in order:
            job = new_jobs[index]
            parents = list(job.depends_on)
            for position in job.depends_on_items:
                parent_job, created = answers[position]
                parents.append(parent_job.id)
                if parent_job.id not in statuses:
                    if created:
                        statuses[parent_job.id] = parent_job.status.value
                    else:  # an existing job its resource key returned: lock it as a parent too
                        statuses.update(rows.lock_parents(job.owner_id, [parent_job.id]))
            # Two refs whose items a resource key made one job, or a ref and an
            # id naming the same job: one parent, waited for once.
            parents = list(dict.fromkeys(parents))
            values = sm.new_job_values(job)
            if index in has_children:
                values["has_dependents"] = True
            key = (job.owner_id, job.resource_type, job.resource_id)
            if job.resource_id and key in by_resource:
                answers[index] = (by_resource[key], False)
                continue
            row, row_events = self._child_row(values, parents, job.on_parent_failure, statuses, now)
            if job.resource_id:
                if pending_rows:
                    rows.insert_jobs(pending_rows)
                    pending_rows = []
                if not rows.insert_root(row):
                    # The resource's existing job answers; its parents stay as they were.
                    existing = sm.job_of(rows.latest_for_resource(*key))
                    by_resource[key] = existing
                    answers[index] = (existing, False)
                    continue
                by_resource[key] = sm.job_of(row)
            else:
                pending_rows.append(row)
            edges.extend((parent, row["id"]) for parent in parents)
            events.extend(row_events)
            written.append(row)
            answers[index] = (sm.job_of(row), True)
        if pending_rows:
            rows.insert_jobs(pending_rows)
        if edges:
            rows.insert_dependencies(edges)
        if events:
            rows.insert_events(events, feed.subjects_of(written))
            rows.announce_work()
        return [answers[index] for index in range(len(new_jobs))]

    def _child_row(
        self,
        values: dict[str, Any],
        parents: list[str],
        policy: ParentFailurePolicy,
        statuses: Mapping[str, str | None],
        now: datetime,
    ) -> tuple[dict[str, Any], list[JobEvent]]:
        """A new job's row and events: queued and waiting while parents are
        pending, due at once when none is, ended at once (as its parent's
        ending would have ended it) when one already ended it."""
        if not parents:
            row = sm.queued_row(values, now)
            return row, enqueue_events(row["id"], now)
        standing = dependencies.standing(((parent, statuses.get(parent)) for parent in parents), policy)
        row = sm.queued_row({**values, **sm.dependency_values(parents, policy, standing.pending)}, now)
        events = enqueue_events(row["id"], now)
        if standing.failed_parent is not None:
            row.update(self._failed_values(row, standing.failed_parent, now))
            events.extend(self._failed_events(row, standing.failed_parent[0], now))
        elif standing.pending == 0:
            row["last_event_sequence"] += len(sm.DEPENDENCIES_MET.events)
            events.extend(self._events(sm.DEPENDENCIES_MET, row, {}, now))
        return row, events

    def _new_retries(self, rows: Rows, sources: Sequence[Columns], now: datetime) -> list[dict[str, Any]]:
        """The new jobs a Retry (or a BulkRetry batch) makes of `sources`,
        written with their events: each copies its source's parents, and
        stands among them as a new job would (a parent still failed ends a
        `CANCEL` child at once; a parent no longer kept counts as failed)."""
        named = sorted({parent for source in sources for parent in source["depends_on"] or ()})
        statuses: dict[str, str | None] = {}
        for owner_id in sorted({source["owner_id"] for source in sources if source["depends_on"]}):
            statuses.update(rows.lock_parents(owner_id, named))
        new: list[dict[str, Any]] = []
        events: list[JobEvent] = []
        edges: list[tuple[str, str]] = []
        for source in sources:
            values = {"id": ids.new_job_id(), **sm.retry_values(source)}
            parents = list(dict.fromkeys(source["depends_on"] or ()))
            policy = ParentFailurePolicy(source["on_parent_failure"] or ParentFailurePolicy.CANCEL)
            row, row_events = self._child_row(values, parents, policy, statuses, now)
            new.append(row)
            events.extend(row_events)
            edges.extend((parent, row["id"]) for parent in parents)
        if new:
            rows.insert_jobs(new)
            if edges:
                rows.insert_dependencies(edges)
            rows.insert_events(events, feed.subjects_of(new))
            rows.announce_work()
        return new

    # ----- a parent's ending --------------------------------------------------------------

    def _settle_children(self, rows: Rows, ended: dict[str, str], now: datetime) -> None:
        """Carry the endings of `ended` (parent id → its final status) to their
        waiting children: count each off, make due those with none left, and
        end those a failure ends, whose own children are settled next."""
        while ended:
            found = rows.waiting_children(sorted(ended))
            by_child: dict[str, tuple[Columns, list[str]]] = {}
            for child, parent in found:
                by_child.setdefault(child["id"], (child, []))[1].append(parent)
            written: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            events: list[JobEvent] = []
            released = False
            next_ended: dict[str, str] = {}
            for child, parents in by_child.values():
                policy = ParentFailurePolicy(child["on_parent_failure"])
                failed = next(
                    (parent for parent in parents if not dependencies.ended_well(ended[parent], policy)), None
                )
                new = dict(child)
                new["updated_at"] = now
                if failed is not None:
                    new.update(self._failed_values(child, (failed, ended[failed]), now))
                    events.extend(self._failed_events(new, failed, now))
                    if child["has_dependents"]:
                        next_ended[child["id"]] = new["status"]
                    changes = ENDED_COLUMNS
                else:
                    new["pending_dependencies"] = max(child["pending_dependencies"] - len(parents), 0)
                    changes = COUNTED_COLUMNS
                    if new["pending_dependencies"] == 0:
                        new["available_at"] = sm.due_at(child["run_at"], now)
                        new["last_event_sequence"] += len(sm.DEPENDENCIES_MET.events)
                        events.extend(self._events(sm.DEPENDENCIES_MET, new, {}, now))
                        released = True
                        changes = RELEASED_COLUMNS
                written.setdefault(changes, []).append(new)
            for changes, children in written.items():
                rows.write_children(children, changes)
            if events:
                rows.insert_events(events)
            if released:
                rows.announce_work()
            ended = next_ended

    @staticmethod
    def _failed_values(row: Columns, parent: tuple[str, str | None], now: datetime) -> dict[str, Any]:
        """What a parent's failure changes of a waiting child: ended cancelled,
        naming the parent, its pending count cleared."""
        return {
            "status": sm.DEPENDENCY_FAILED.status.value,
            "completed_at": now,
            "updated_at": now,
            "pending_dependencies": 0,
            "error_message": sm.dependency_failed_message(*parent),
            "error_type": sm.DEPENDENCY_FAILED_ERROR_TYPE,
            "last_event_sequence": row["last_event_sequence"] + len(sm.DEPENDENCY_FAILED.events),
        }

    def _failed_events(self, row: Columns, parent_id: str, now: datetime) -> list[JobEvent]:
        return self._events(sm.DEPENDENCY_FAILED, row, {"parent_job_id": parent_id}, now)

    @staticmethod
    def _events(branch: sm.Branch, row: Columns, payload: JsonObject, now: datetime) -> list[JobEvent]:
        """`branch`'s events for `row` (whose last_event_sequence includes
        them), the first carrying `payload`."""
        first = row["last_event_sequence"] - len(branch.events) + 1
        return [
            JobEvent(row["id"], first + offset, event_type, payload if offset == 0 else {}, now)
            for offset, event_type in enumerate(branch.events)
        ]

    # ----- a claimed child's inputs -------------------------------------------------------

    @staticmethod
    def _parent_results(rows: Rows, claimed: Sequence[Columns]) -> dict[str, dict[str, JsonObject]]:
        """Per claimed job with parents, the results its handler is handed:
        each succeeded parent's, in depends_on order, within
        `dependencies.PARENT_RESULTS_LIMIT_BYTES`."""
        with_parents = [row for row in claimed if row["depends_on"]]
        if not with_parents:
            return {}
        results = rows.parent_results(
            sorted({parent for row in with_parents for parent in row["depends_on"]})
        )
        return {row["id"]: dependencies.handed_results(row["depends_on"], results) for row in with_parents}

"""The in-memory engine's store and its `Rows`: every job, event, schedule and
record of one process in dicts, and each of the operations' asks executed
over them in Python (every transition the state machine's `Transition.apply`),
journaled so a unit of work that raises is undone as a rollback would."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from leasehold._server.clock import Clock
from leasehold._server.jobs import admin, schedules, steering
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import ScheduleExists
from leasehold._server.jobs.idempotency import RequestKey
from leasehold._server.jobs.operations.rows import Columns, RecoveryDue
from leasehold._server.jobs.records import (
    FeedEvent,
    FeedHead,
    JobEvent,
    JobFilter,
    JobStatus,
    JobSubject,
    Lease,
)
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.worker_writes import WorkerWrite

Row = dict[str, Any]

_QUEUED = JobStatus.QUEUED.value
_RUNNING = JobStatus.RUNNING.value
# Kept as JSON text, decoded afresh on every read.
_JSON_COLUMNS = ("payload", "result", "checkpoint")
_ABSENT = object()
# What a new row holds where its insert names nothing (the schema's defaults).
_NEW_ROW: Row = {**dict.fromkeys(sm.JOB_COLUMNS), "pending_dependencies": 0, "has_dependents": False}


def _dumps(value: Any) -> str:
    return json.dumps(value)


def decoded(row: Mapping[str, Any]) -> Row:
    """`row` as the operations see it: its JSON columns decoded afresh."""
    out = dict(row)
    for column in _JSON_COLUMNS:
        if out[column] is not None:
            out[column] = json.loads(out[column])
    return out


# What `Rows.waiting_children` answers of a child.
_CHILD_COLUMNS = (
    "id",
    "run_at",
    "pending_dependencies",
    "on_parent_failure",
    "has_dependents",
    "last_event_sequence",
)


class Journal:
    """What a unit of work changed, to undo it if the unit raises."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def put(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        old = mapping.get(key, _ABSENT)
        mapping[key] = value
        self._undo.append(lambda: mapping.__setitem__(key, old) if old is not _ABSENT else mapping.pop(key))

    def delete(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        old = mapping.pop(key)
        self._undo.append(lambda: mapping.__setitem__(key, old))

    def append(self, items: list[Any], item: Any) -> None:
        items.append(item)
        self._undo.append(items.pop)

    def mark(self) -> int:
        return len(self._undo)

    def undo(self, mark: int = 0) -> None:
        while len(self._undo) > mark:
            self._undo.pop()()


@dataclass
class Pending:
    """What one unit of work will announce once it has changed everything it
    changes (the in-memory counterpart of a commit)."""

    work: bool = False
    events: list[JobEvent] = field(default_factory=list)


class MemoryStore:
    """Every job, event, schedule and record of one process, in dicts. Rows are
    kept in insertion order (a dict keeps the order its keys were first
    inserted in, and a row changes by replacing its value), which is the `seq`
    order the SQL engines sort by. Lookups scan: this engine serves tests, not
    queues of millions."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.rows: dict[str, Row] = {}
        # Per job: (sequence, type, payload as JSON text, created_at), in sequence order.
        self.events: dict[str, list[tuple[int, str, str, datetime]]] = {}
        # (owner, resource type, resource id) -> its root job, and its newest job.
        self.roots: dict[tuple[str, str, str], str] = {}
        self.latest: dict[tuple[str, str, str], str] = {}
        self.counters = {"seq": 1}
        # Each rate-limited kind's token bucket, once drawn from.
        self.buckets: dict[str, steering.Bucket] = {}
        # (owner, schedule id) -> the schedule, and its template's payload as JSON text.
        self.schedules: dict[tuple[str, str], tuple[schedules.Schedule, str]] = {}
        # Kinds AdminService.PauseKind holds (the value is unused): claims skip them.
        self.paused: dict[str, bool] = {}
        # (owner, request id) -> (method, fingerprint, the first answer, when it was made).
        self.request_ids: dict[tuple[str, str], tuple[str, str, list[dict[str, Any]], datetime]] = {}
        # Per job: (lease token, request key) -> the worker write's record.
        self.worker_writes: dict[str, dict[tuple[str, str], WorkerWrite]] = {}
        # Per parent job: the ids of the jobs that depend on it, in the order
        # they were enqueued (a deleted child's id stays; lookups skip it).
        self.children: dict[str, list[str]] = {}
        # Per owner: its feed as (position, job id, sequence), in position order
        # (a deleted job's events stay; reads skip them), and its head.
        self.feed: dict[str, list[tuple[int, str, int]]] = {}
        self.feed_heads: dict[str, FeedHead] = {}

    def now(self) -> datetime:
        """The clock's time as a database hands it back: aware, in UTC."""
        now = self._clock.now()
        if now.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        return now.astimezone(UTC)

    def stored_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule | None:
        """The owner's schedule, its payload decoded afresh; another owner's is
        as missing as an unknown id."""
        stored = self.schedules.get((owner_id, schedule_id))
        if stored is None:
            return None
        schedule, payload = stored
        return replace(schedule, template=replace(schedule.template, payload=json.loads(payload)))

    def newest(self, wanted: Callable[[Row], bool], below: int | None, limit: int) -> list[Row]:
        """Up to `limit` rows below the position `below`, newest first, that are `wanted`."""
        found: list[Row] = []
        for row in reversed(self.rows.values()):
            if len(found) >= limit:
                break
            if (below is None or row["seq"] < below) and wanted(row):
                found.append(row)
        return found


class MemoryRows:
    """`Rows` over the repository's dicts, every change journaled."""

    def __init__(self, store: MemoryStore, journal: Journal, pending: Pending) -> None:
        self._r = store
        self._journal = journal
        self._pending = pending

    def now(self) -> datetime:
        return self._r.now()

    # ----- new jobs -------------------------------------------------------------------

    def insert_jobs(self, rows: Sequence[Columns]) -> None:
        # Encoded first, every one of them: a payload no database could store
        # fails the unit of work before any of its rows is kept.
        encoded = [{**row, "payload": _dumps(row["payload"])} for row in rows]
        r, journal = self._r, self._journal
        for values in encoded:
            row: Row = {**_NEW_ROW, **values, "seq": r.counters["seq"]}
            journal.put(r.counters, "seq", row["seq"] + 1)
            journal.put(r.rows, row["id"], row)
            journal.put(r.events, row["id"], [])
            if row["resource_id"]:
                key = (row["owner_id"], row["resource_type"], row["resource_id"])
                journal.put(r.latest, key, row["id"])
                if row["retry_of_job_id"] is None:
                    journal.put(r.roots, key, row["id"])

    def insert_root(self, row: Columns) -> bool:
        if (row["owner_id"], row["resource_type"], row["resource_id"]) in self._r.roots:
            return False
        self.insert_jobs([row])
        return True

    def latest_for_resource(self, owner_id: str, resource_type: str, resource_id: str) -> Columns:
        return decoded(self._r.rows[self._r.latest[(owner_id, resource_type, resource_id)]])

    def insert_events(
        self, events: Sequence[JobEvent], subjects: Mapping[str, JobSubject] | None = None
    ) -> None:
        # Encoded now, as a database would bind it: a payload none could store
        # fails its own operation. Written by `feed.seal`, at the end.
        for event in events:
            self._pending.events.append(replace(event, payload=json.loads(_dumps(event.payload))))

    # ----- the owners' feeds ------------------------------------------------------------

    def feed_subjects(self, job_ids: Sequence[str]) -> dict[str, JobSubject]:
        rows = self._r.rows
        return {job_id: JobSubject.of(rows[job_id]) for job_id in job_ids}

    def advance_feed_heads(self, counts: Mapping[str, int]) -> dict[str, int]:
        heads = self._r.feed_heads
        for owner, count in counts.items():
            head = heads.get(owner, FeedHead(0, 0))
            self._journal.put(heads, owner, replace(head, last_position=head.last_position + count))
        return {owner: heads[owner].last_position for owner in counts}

    def write_events(self, events: Sequence[FeedEvent]) -> None:
        r, journal = self._r, self._journal
        for numbered in events:
            event, owner = numbered.event, numbered.subject.owner_id
            journal.append(
                r.events[event.job_id], (event.sequence, event.type, _dumps(event.payload), event.created_at)
            )
            if owner not in r.feed:
                journal.put(r.feed, owner, [])
            journal.append(r.feed[owner], (numbered.position, event.job_id, event.sequence))

    def announce_work(self) -> None:
        self._pending.work = True

    # ----- graphs of jobs ------------------------------------------------------------

    def lock_parents(self, owner_id: str, job_ids: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for job_id in job_ids:
            row = self._r.rows.get(job_id)
            if row is not None and row["owner_id"] == owner_id:
                if not row["has_dependents"]:
                    self._journal.put(self._r.rows, job_id, {**row, "has_dependents": True})
                found[job_id] = row["status"]
        return found

    def insert_dependencies(self, edges: Sequence[tuple[str, str]]) -> None:
        for parent, child in edges:
            if parent not in self._r.children:
                self._journal.put(self._r.children, parent, [])
            self._journal.append(self._r.children[parent], child)

    def waiting_children(self, parent_ids: Sequence[str]) -> list[tuple[Columns, str]]:
        found = [
            (self._r.rows[child], parent)
            for parent in parent_ids
            for child in self._r.children.get(parent, ())
            if child in self._r.rows
        ]
        return sorted(
            (
                ({column: row[column] for column in _CHILD_COLUMNS}, parent)
                for row, parent in found
                if row["status"] == _QUEUED and row["pending_dependencies"] > 0
            ),
            key=lambda pair: pair[0]["id"],
        )

    def write_children(self, children: Sequence[Columns], columns: Sequence[str]) -> None:
        for child in children:
            current = self._r.rows[child["id"]]
            self._journal.put(self._r.rows, child["id"], {**current, **{c: child[c] for c in columns}})

    def parent_results(self, job_ids: Sequence[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for job_id in job_ids:
            row = self._r.rows.get(job_id)
            if row is not None and row["status"] == JobStatus.SUCCEEDED.value and row["result"] is not None:
                found[job_id] = json.loads(row["result"])
        return found

    # ----- transitions ----------------------------------------------------------------

    def _apply(self, transition: sm.Transition, row: Row, inputs: sm.Inputs) -> Row:
        stored = replace(
            inputs,
            result=None if inputs.result is None else _dumps(inputs.result),
            checkpoint=None if inputs.checkpoint is None else _dumps(inputs.checkpoint),
        )
        new, _branch = transition.apply(row, stored)
        self._journal.put(self._r.rows, row["id"], new)
        return decoded(new)

    def owned_job(self, owner_id: str, job_id: str) -> Columns | None:
        source = self.retry_source(owner_id, job_id)
        return None if source is None else {**source, "result": None}

    def retry_source(self, owner_id: str, job_id: str) -> Columns | None:
        row = self._r.rows.get(job_id)
        return None if row is None or row["owner_id"] != owner_id else decoded(row)

    def transition_owned(
        self, transition: sm.Transition, owner_id: str, job_id: str, inputs: sm.Inputs
    ) -> Columns:
        return self._apply(transition, self._r.rows[job_id], inputs)

    def transition_leases(
        self, transition: sm.Transition, leases: Sequence[Lease], inputs: sm.Inputs, brief: bool = False
    ) -> list[Columns]:
        changed: list[Columns] = []
        for lease in leases:
            row = fenced(self._r.rows.get(lease.job_id), lease, inputs.now)
            if row is None:
                continue
            if (
                transition.within_deadline
                and row["deadline_at"] is not None
                and row["deadline_at"] <= inputs.now
            ):
                continue  # past its deadline: the rescuer ends it
            changed.append(self._apply(transition, row, inputs))
        return changed

    def transition_chosen(
        self, transition: sm.Transition, job_ids: Sequence[str], inputs: sm.Inputs
    ) -> list[Columns]:
        return [self._apply(transition, self._r.rows[job_id], inputs) for job_id in job_ids]

    def transition_found(self, transition: sm.Transition, inputs: sm.Inputs) -> list[Columns]:
        column = "lease_expires_at" if transition.find is sm.Find.EXPIRED else "deadline_at"
        found = [
            row
            for row in self._r.rows.values()
            if row["status"] == transition.source.value
            and row[column] is not None
            and row[column] <= inputs.now
        ]
        return [self._apply(transition, row, inputs) for row in found]

    def transition_batch(
        self, transition: sm.Transition, batch: Sequence[Columns], inputs: sm.Inputs
    ) -> list[Columns]:
        current = [self._r.rows[row["id"]] for row in batch]
        return [
            self._apply(transition, row, inputs)
            for row in current
            if row["status"] == transition.source.value
        ]

    def take_event_sequences(
        self, leases: Sequence[Lease], max_events: int | None, now: datetime
    ) -> dict[tuple[str, str], tuple[int, JobSubject]]:
        taken = {}
        for lease in leases:
            row = fenced(self._r.rows.get(lease.job_id), lease, now)
            if row is None or (max_events is not None and row["last_event_sequence"] >= max_events):
                continue
            sequence = row["last_event_sequence"] + 1
            self._journal.put(self._r.rows, lease.job_id, {**row, "last_event_sequence": sequence})
            taken[(lease.job_id, lease.token)] = (sequence, JobSubject.of(row))
        return taken

    def held_leases(self, leases: Sequence[Lease], now: datetime) -> set[tuple[str, str]]:
        return {(x.job_id, x.token) for x in leases if fenced(self._r.rows.get(x.job_id), x, now) is not None}

    # ----- claims ----------------------------------------------------------------------

    def lock_claims(self) -> None:
        """One unit of work at a time here: nothing to hold off."""

    def reanchor_after_clock_step(self, now: datetime) -> None:
        for job_id, row in list(self._r.rows.items()):
            if (
                row["status"] == _QUEUED
                and now < row["available_at"] < sm.AWAITING_PARENTS
                and row["updated_at"] > now
            ):
                delay = row["available_at"] - row["updated_at"]
                self._journal.put(
                    self._r.rows, job_id, {**row, "available_at": now + delay, "updated_at": now}
                )

    def queue_view(self, kinds: KindFilter, now: datetime) -> MemoryQueueView:
        return MemoryQueueView(self._r.rows.values(), kinds, now, set(self._r.paused))

    def bucket_tokens(self, rates: Mapping[str, steering.Rate], now: datetime) -> dict[str, float]:
        return {kind: steering.refill(self._r.buckets.get(kind), rate, now) for kind, rate in rates.items()}

    def spend_tokens(self, tokens: Mapping[str, float], spent: Mapping[str, int], now: datetime) -> None:
        for kind, count in spent.items():
            self._journal.put(self._r.buckets, kind, steering.Bucket(tokens[kind] - count, now))

    def next_wakeup(self, kinds: KindFilter, now: datetime) -> datetime | None:
        moments = [
            row["available_at"] if row["status"] == _QUEUED else row["lease_expires_at"]
            for row in self._r.rows.values()
            if (
                row["status"] == _QUEUED
                and now < row["available_at"] < sm.AWAITING_PARENTS
                and kinds.admits(row["kind"])
                and row["kind"] not in self._r.paused
            )
            or row["status"] == _RUNNING
        ]
        return min(moments, default=None)

    # ----- request ids and worker writes ------------------------------------------

    def take_request_keys(
        self, keys: Sequence[tuple[RequestKey, list[dict[str, Any]]]], now: datetime
    ) -> set[tuple[str, str]]:
        taken = set()
        for key, response in keys:
            ident = (key.owner_id, key.request_id)
            if ident not in self._r.request_ids:
                self._journal.put(
                    self._r.request_ids, ident, (key.method.value, key.fingerprint, response, now)
                )
                taken.add(ident)
        return taken

    def set_request_response(self, key: RequestKey, response: list[dict[str, Any]]) -> None:
        ident = (key.owner_id, key.request_id)
        method, fingerprint, _, created_at = self._r.request_ids[ident]
        self._journal.put(self._r.request_ids, ident, (method, fingerprint, response, created_at))

    def request_record(self, key: RequestKey) -> tuple[str, str, list[dict[str, Any]]]:
        method, fingerprint, response, _ = self._r.request_ids[(key.owner_id, key.request_id)]
        return method, fingerprint, response

    def jobs_named(self, owner_id: str, job_ids: Collection[str]) -> list[Columns]:
        named = (self._r.rows.get(job_id) for job_id in job_ids)
        return [decoded(row) for row in named if row is not None and row["owner_id"] == owner_id]

    def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None:
        return self._r.worker_writes.get(lease.job_id, {}).get((lease.token, request_key))

    def keep_worker_write(self, record: WorkerWrite) -> None:
        kept = self._r.worker_writes.setdefault(record.job_id, {})
        self._journal.put(kept, (record.lease_token, record.request_key), record)

    # ----- schedules ---------------------------------------------------------------------

    def insert_schedule(self, schedule: schedules.Schedule) -> schedules.Schedule:
        if (schedule.owner_id, schedule.schedule_id) in self._r.schedules:
            raise ScheduleExists(schedule.schedule_id)
        self.store_schedule(schedule)
        stored = self._r.stored_schedule(schedule.owner_id, schedule.schedule_id)
        assert stored is not None
        return stored

    def owned_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule | None:
        return self._r.stored_schedule(owner_id, schedule_id)

    def store_schedule(self, schedule: schedules.Schedule) -> None:
        stored = (schedule, _dumps(schedule.template.payload))
        self._journal.put(self._r.schedules, (schedule.owner_id, schedule.schedule_id), stored)

    def delete_schedule(self, owner_id: str, schedule_id: str) -> bool:
        if (owner_id, schedule_id) not in self._r.schedules:
            return False
        self._journal.delete(self._r.schedules, (owner_id, schedule_id))
        return True

    def due_schedules(self, now: datetime, limit: int) -> list[schedules.Schedule]:
        due = sorted(
            (
                s
                for s, _ in self._r.schedules.values()
                if s.next_fire_at is not None and s.next_fire_at <= now
            ),
            key=lambda s: s.next_fire_at,  # type: ignore[arg-type,return-value]
        )
        found = (self._r.stored_schedule(s.owner_id, s.schedule_id) for s in due[:limit])
        return [s for s in found if s is not None]

    def job_status(self, job_id: str) -> str | None:
        row = self._r.rows.get(job_id)
        return None if row is None else str(row["status"])

    # ----- retention and bulk actions ------------------------------------------------

    def expired_job_ids(self, finished_before: datetime, limit: int) -> list[str]:
        def expired(row: Row) -> bool:
            return (
                JobStatus(row["status"]).is_terminal
                and row["completed_at"] is not None
                and row["completed_at"] < finished_before
                and not self._waited_on(row)
            )

        def key(row: Row) -> tuple[str, str, str]:
            return (row["owner_id"], row["resource_type"], row["resource_id"])

        # A resource key's jobs go together, once every one has expired.
        in_use = {key(row) for row in self._r.rows.values() if row["resource_id"] and not expired(row)}
        return [row["id"] for row in self._r.rows.values() if expired(row) and key(row) not in in_use][:limit]

    def _waited_on(self, row: Row) -> bool:
        """Whether a child of the job is still to run (it reads its parents' results)."""
        if not row["has_dependents"]:
            return False
        children = (self._r.rows.get(child) for child in self._r.children.get(row["id"], ()))
        return any(child is not None and child["status"] in sm.LIVE_STATUSES for child in children)

    def delete_jobs(self, job_ids: Sequence[str]) -> int:
        r, journal = self._r, self._journal
        deleted = 0
        for job_id in job_ids:
            row = r.rows.get(job_id)
            if row is None or not JobStatus(row["status"]).is_terminal or self._waited_on(row):
                continue
            deleted += 1
            journal.delete(r.rows, job_id)
            journal.delete(r.events, job_id)
            self._expire_feed(row["owner_id"], job_id)
            if job_id in r.worker_writes:
                journal.delete(r.worker_writes, job_id)
            key = (row["owner_id"], row["resource_type"], row["resource_id"])
            for index in (r.roots, r.latest):
                if index.get(key) == job_id:
                    journal.delete(index, key)
        return deleted

    def _expire_feed(self, owner_id: str, job_id: str) -> None:
        """Retention's mark past the deleted job's newest event in its owner's feed."""
        through = max(
            (position for position, of, _ in self._r.feed.get(owner_id, ()) if of == job_id), default=0
        )
        head = self._r.feed_heads.get(owner_id)
        if head is not None and head.expired_through < through:
            self._journal.put(self._r.feed_heads, owner_id, replace(head, expired_through=through))

    def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        # Kept in the order they were made, so the oldest come first.
        doomed = [key for key, stored in self._r.request_ids.items() if stored[3] < created_before][:limit]
        for key in doomed:
            self._journal.delete(self._r.request_ids, key)
        return len(doomed)

    def bulk_batch(
        self, job_filter: admin.AdminFilter, below: int | None, limit: int, unretried: bool, lock: bool
    ) -> list[Columns]:
        retried = {row["retry_of_job_id"] for row in self._r.rows.values()} if unretried else set()
        matching = admin_match(job_filter)
        found = self._r.newest(lambda row: row["id"] not in retried and matching(row), below, limit)
        return [decoded(row) for row in found]

    def retried_among(self, job_ids: Sequence[str]) -> set[str]:
        wanted = set(job_ids)
        return {row["retry_of_job_id"] for row in self._r.rows.values() if row["retry_of_job_id"] in wanted}

    def pause_kind(self, kind: str, now: datetime) -> None:
        self._journal.put(self._r.paused, kind, True)

    def resume_kind(self, kind: str) -> bool:
        if kind not in self._r.paused:
            return False
        self._journal.delete(self._r.paused, kind)
        return True


class MemoryQueueView:
    """`steering.QueueView` over the rows, by scanning them when first asked
    (after the claim's recovery has run, as the SQL engines read then)."""

    counted_at: datetime | None = None

    def __init__(
        self, rows: Iterable[Row], kinds: KindFilter, now: datetime, paused: set[str] | None = None
    ) -> None:
        self._source = rows
        self._kinds = kinds
        self._now = now
        self._held = paused or set()

    @property
    def _due(self) -> list[Row]:
        return [
            row
            for row in self._source
            if row["status"] == _QUEUED
            and row["available_at"] <= self._now
            and self._kinds.admits(row["kind"])
            and row["kind"] not in self._held
        ]

    def recovery_due(self) -> RecoveryDue:
        running = [row for row in self._source if row["status"] == _RUNNING]
        return RecoveryDue(
            expired=any(row["lease_expires_at"] <= self._now for row in running),
            overdue=any(
                row["deadline_at"] is not None and row["deadline_at"] <= self._now for row in running
            ),
        )

    def recovered(self) -> None:
        """Every question scans the rows afresh: nothing to forget."""

    def running(self) -> steering.Running:
        live = [
            row for row in self._source if row["status"] == _RUNNING and row["lease_expires_at"] > self._now
        ]
        return steering.Running(
            Counter(row["owner_id"] for row in live), Counter(row["kind"] for row in live)
        )

    def due_priorities(self) -> list[tuple[int, str | None]]:
        owners: dict[int, set[str]] = {}
        for row in self._due:
            owners.setdefault(row["priority"], set()).add(row["owner_id"])
        return [
            (priority, next(iter(found)) if len(found) == 1 else None)
            for priority, found in sorted(owners.items())
        ]

    def owners_with_due(
        self, priority: int, after: str, count: int
    ) -> list[tuple[str, steering.Head | None]]:
        # One claim at a time here, so each owner's oldest job comes along.
        oldest: dict[str, steering.Head] = {}
        for row in self._due:
            if row["priority"] != priority:
                continue
            head = steering.Head(row["id"], row["kind"], _claim_position(row))
            known = oldest.get(row["owner_id"])
            if known is None or head.position < known.position:  # type: ignore[operator]
                oldest[row["owner_id"]] = head
        owners = sorted(oldest)
        rotated = [owner for owner in owners if owner > after] + [owner for owner in owners if owner <= after]
        return [(owner, oldest[owner]) for owner in rotated[:count]]

    def heads(
        self, priority: int, wanted: Sequence[steering.HeadsWanted], blocked_kinds: frozenset[str]
    ) -> dict[str, list[steering.Head]]:
        due = self._due
        return {want.owner_id: _heads(due, priority, want, blocked_kinds) for want in wanted}


def _heads(
    due: list[Row], priority: int, want: steering.HeadsWanted, blocked_kinds: frozenset[str]
) -> list[steering.Head]:
    found = [
        steering.Head(row["id"], row["kind"], _claim_position(row))
        for row in due
        if row["priority"] == priority
        and row["owner_id"] == want.owner_id
        and row["kind"] not in blocked_kinds
    ]
    found.sort(key=lambda head: head.position)  # type: ignore[arg-type,return-value]
    if want.after is not None:
        found = [head for head in found if head.position > want.after]  # type: ignore[operator]
    return found[: want.count]


def fenced(row: Row | None, lease: Lease, now: datetime) -> Row | None:
    """The job this lease still owns (running, this token, lease unexpired), or None."""
    if (
        row is None
        or row["status"] != _RUNNING
        or row["lease_token"] != lease.token
        or row["lease_expires_at"] <= now
    ):
        return None
    return row


def _claim_position(row: Row) -> tuple[object, ...]:
    return tuple(row[column] for column in sm.CLAIM_ORDER)


def admin_match(job_filter: admin.AdminFilter) -> Callable[[Row], bool]:
    """`job_filter` as a test of a row (any owner, or its `owner_id`)."""
    return lambda row: (
        (not job_filter.owner_id or row["owner_id"] == job_filter.owner_id) and matches(row, job_filter.jobs)
    )


def matches(row: Mapping[str, Any], job_filter: JobFilter) -> bool:
    if job_filter.statuses and JobStatus(row["status"]) not in job_filter.statuses:
        return False
    wanted = (
        ("kind", job_filter.kind),
        ("resource_type", job_filter.resource_type),
        ("resource_id", job_filter.resource_id),
    )
    if job_filter.depends_on and job_filter.depends_on not in (row["depends_on"] or ()):
        return False
    return all(not value or row[column] == value for column, value in wanted)

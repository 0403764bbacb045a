"""What an engine does inside one unit of work: find, lock, insert and update
rows, and answer the operations' queries. Nothing here decides anything.

Every method runs inside the transaction the engine opened for the operation
(`OperatedRepository._write`); what it changes commits or rolls back with the
rest. Rows come back as mappings of the job columns with JSON values decoded
(a payload, a result, a checkpoint as the caller gave them).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from leasehold._server.jobs import schedules, steering
from leasehold._server.jobs.admin import AdminFilter
from leasehold._server.jobs.idempotency import RequestKey
from leasehold._server.jobs.records import FeedEvent, JobEvent, JobSubject, Lease
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.state_machine import Inputs, Transition
from leasehold._server.jobs.worker_writes import WorkerWrite

Columns = Mapping[Any, Any]  # a row mapping: SQLAlchemy keys its rows by Any


@dataclass(frozen=True, slots=True)
class RecoveryDue:
    """Which of a claim's two recoveries have work: a running job's lease
    expired (`expired`), or a running job passed its deadline (`overdue`)."""

    expired: bool
    overdue: bool


class QueueView(steering.QueueView, Protocol):
    """The due queue as one claim sees it (`steering.QueueView`), and when its
    running jobs were counted (None: not counted, or not by the database's clock)."""

    @property
    def counted_at(self) -> datetime | None: ...

    def recovery_due(self) -> RecoveryDue:
        """Whether the claim's recoveries have work at the view's `now`. Asked
        first, it rides with the view's first question to the database: most
        claims recover nothing and then send no recovery statements at all."""
        ...

    def recovered(self) -> None:
        """The claim's recovery changed jobs: what the view read before it is
        read again when next asked."""
        ...


class Rows(Protocol):
    def now(self) -> datetime:
        """The time the operation acts at, read once the transaction is open."""
        ...

    # ----- new jobs -------------------------------------------------------------------

    def insert_jobs(self, rows: Sequence[Columns]) -> None:
        """New queued jobs (`state_machine.queued_row`), none of them a resource's
        first: no dedup."""
        ...

    def insert_root(self, row: Columns) -> bool:
        """A resource's new job, unless the resource already has a root job (then
        nothing is written and the answer is False)."""
        ...

    def latest_for_resource(self, owner_id: str, resource_type: str, resource_id: str) -> Columns:
        """The newest job of a resource known to have one."""
        ...

    def insert_events(
        self, events: Sequence[JobEvent], subjects: Mapping[str, JobSubject] | None = None
    ) -> None:
        """Hold `events` for the end of the unit of work, where `feed.seal`
        numbers and writes them (and the engine announces them once the
        transaction commits); nothing is written yet. `subjects`: whose their
        jobs are, where the caller has the rows (saves looking them up)."""
        ...

    # ----- the owners' feeds (see `operations.feed`) ---------------------------------

    def feed_subjects(self, job_ids: Sequence[str]) -> dict[str, JobSubject]:
        """Each of `job_ids`' owner, kind and resource (every one exists)."""
        ...

    def advance_feed_heads(self, counts: Mapping[str, int]) -> dict[str, int]:
        """Move each owner's newest position on by its count (an owner new to
        the feed starts at 0), locking its head until the transaction commits,
        in the order given; the new newest position of each."""
        ...

    def write_events(self, events: Sequence[FeedEvent]) -> None:
        """Store numbered events."""
        ...

    # ----- graphs of jobs ------------------------------------------------------------

    def lock_parents(self, owner_id: str, job_ids: Sequence[str]) -> dict[str, str]:
        """The owner's jobs among `job_ids` (sorted), locked and marked as
        having dependents, by id with their status; another owner's and unknown
        ids are left out alike."""
        ...

    def insert_dependencies(self, edges: Sequence[tuple[str, str]]) -> None:
        """Keep each (parent id, child id) edge; the children are in already."""
        ...

    def waiting_children(self, parent_ids: Sequence[str]) -> list[tuple[Columns, str]]:
        """The queued children with pending parents of each of `parent_ids`,
        each locked, as (child, parent id) in child id order (a child of two of
        them comes twice). A child carries id, run_at, pending_dependencies,
        on_parent_failure, has_dependents and last_event_sequence."""
        ...

    def write_children(self, children: Sequence[Columns], columns: Sequence[str]) -> None:
        """Store `columns` of each child (by its id) as settling left them."""
        ...

    def parent_results(self, job_ids: Sequence[str]) -> dict[str, Any]:
        """The results of those of `job_ids` that succeeded with one."""
        ...

    def announce_work(self) -> None:
        """Tell claimers (here and on every replica) to look again once the
        transaction commits."""
        ...

    # ----- transitions of existing jobs ----------------------------------------------

    def owned_job(self, owner_id: str, job_id: str) -> Columns | None:
        """The owner's job, locked for the rest of the transaction, without its
        result (an owner's write answers the job without it); None for an
        unknown id and another owner's alike."""
        ...

    def retry_source(self, owner_id: str, job_id: str) -> Columns | None:
        """`owned_job` with every column (payload, policy, trace) a retry copies."""
        ...

    def transition_owned(self, transition: Transition, owner_id: str, job_id: str, inputs: Inputs) -> Columns:
        """`transition` (found `Find.OWNER`) applied to the owner's job, which the
        caller locked and found in the transition's source status."""
        ...

    def transition_leases(
        self, transition: Transition, leases: Sequence[Lease], inputs: Inputs, brief: bool = False
    ) -> list[Columns]:
        """`transition` (found `Find.LEASE`) applied to each job whose lease is
        among `leases` (no two on one job): its id and token, still running and
        unexpired, and not past its deadline when `transition.within_deadline`.
        The changed rows, in no order. `brief`: only id, status, attempt,
        last_event_sequence and cancel_requested_at need come back."""
        ...

    def transition_chosen(
        self, transition: Transition, job_ids: Sequence[str], inputs: Inputs
    ) -> list[Columns]:
        """`transition` (`Find.DUE`: a claim) applied to the queued jobs
        `job_ids`, in no order; the rows carry payload and checkpoint."""
        ...

    def transition_found(self, transition: Transition, inputs: Inputs) -> list[Columns]:
        """`transition` applied to every job its `find` names by itself
        (`Find.EXPIRED`, `Find.OVERDUE`) at `inputs.now`."""
        ...

    def transition_batch(
        self, transition: Transition, batch: Sequence[Columns], inputs: Inputs
    ) -> list[Columns]:
        """`transition` (an owner's cancel) applied to those of a bulk batch's
        jobs (`bulk_batch`) still in its source status."""
        ...

    def take_event_sequences(
        self, leases: Sequence[Lease], max_events: int | None, now: datetime
    ) -> dict[tuple[str, str], tuple[int, JobSubject]]:
        """For each lease (no two on one job) that still holds its job and whose
        log has fewer than `max_events` events, the next event sequence, taken,
        with whose job it is (for the owner's feed); keyed by (job id, token)."""
        ...

    def held_leases(self, leases: Sequence[Lease], now: datetime) -> set[tuple[str, str]]:
        """Which of `leases` still hold their jobs, as (job id, token)."""
        ...

    # ----- claims ----------------------------------------------------------------------

    def lock_claims(self) -> None:
        """Hold off every other claim (any process) until this transaction ends."""
        ...

    def reanchor_after_clock_step(self, now: datetime) -> None:
        """Queued jobs stamped in the future by a clock that since stepped back
        keep their delay, counted from `now`."""
        ...

    def queue_view(self, kinds: KindFilter, now: datetime) -> QueueView:
        """The due queue of the kinds `kinds` admits, less paused kinds."""
        ...

    def bucket_tokens(self, rates: Mapping[str, steering.Rate], now: datetime) -> dict[str, float]:
        """What each rate-limited kind's bucket holds at `now`."""
        ...

    def spend_tokens(self, tokens: Mapping[str, float], spent: Mapping[str, int], now: datetime) -> None:
        """Keep each bucket a claim drew from, less what it spent."""
        ...

    def next_wakeup(self, kinds: KindFilter, now: datetime) -> datetime | None:
        """The earliest time a queued job of `kinds` falls due after `now`, or
        any running job's lease expires."""
        ...

    # ----- request ids and worker writes --------------------------------------------

    def take_request_keys(
        self, keys: Sequence[tuple[RequestKey, list[dict[str, Any]]]], now: datetime
    ) -> set[tuple[str, str]]:
        """Record each key (with its response) unless its owner's request id is
        taken; answers the (owner, request id) of those recorded."""
        ...

    def set_request_response(self, key: RequestKey, response: list[dict[str, Any]]) -> None: ...

    def request_record(self, key: RequestKey) -> tuple[str, str, list[dict[str, Any]]]:
        """The (method, fingerprint, response) a taken key holds."""
        ...

    def jobs_named(self, owner_id: str, job_ids: Collection[str]) -> list[Columns]: ...

    def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None: ...

    def keep_worker_write(self, record: WorkerWrite) -> None: ...

    # ----- schedules ------------------------------------------------------------------

    def insert_schedule(self, schedule: schedules.Schedule) -> schedules.Schedule:
        """Keep a new schedule and answer it as stored; ScheduleExists when its
        owner has one of that id."""
        ...

    def owned_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule | None:
        """The owner's schedule, locked; None for another owner's too."""
        ...

    def store_schedule(self, schedule: schedules.Schedule) -> None:
        """Write what a pause, firing or trigger changed."""
        ...

    def delete_schedule(self, owner_id: str, schedule_id: str) -> bool: ...

    def due_schedules(self, now: datetime, limit: int) -> list[schedules.Schedule]:
        """Up to `limit` schedules whose next fire time has come, earliest first,
        locked (another replica's concurrent look skips them)."""
        ...

    def job_status(self, job_id: str) -> str | None:
        """A job's status, None when it is gone."""
        ...

    # ----- retention and bulk actions ---------------------------------------------------

    def expired_job_ids(self, finished_before: datetime, limit: int) -> list[str]:
        """Up to `limit` finished jobs completed before `finished_before`; a job
        with a resource key only once every job of its key has expired."""
        ...

    def delete_jobs(self, job_ids: Sequence[str]) -> int:
        """Delete the finished ones of `job_ids` (but a parent only while no
        child of it is still to run), with their events and records; asked
        again here, however they were found."""
        ...

    def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        """Delete the `limit` oldest request id records made before
        `created_before` (and any made at the same instant as the last)."""
        ...

    def bulk_batch(
        self, job_filter: AdminFilter, below: int | None, limit: int, unretried: bool, lock: bool
    ) -> list[Columns]:
        """A bulk action's next batch: up to `limit` matching jobs below the
        position `below` (None: the top), newest first, each with its `seq`;
        `unretried`: only those no retry was made of yet."""
        ...

    def retried_among(self, job_ids: Sequence[str]) -> set[str]:
        """Which of `job_ids` have a retry (asked again once they are locked)."""
        ...

    def pause_kind(self, kind: str, now: datetime) -> None: ...

    def resume_kind(self, kind: str) -> bool:
        """Whether the kind was paused."""
        ...

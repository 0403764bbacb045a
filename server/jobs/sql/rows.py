"""`Rows` on the SQL engines: each of the operations' asks as a statement on
the writer's open transaction (`WriteTx`). Every transition is one UPDATE the
state machine compiled (`transitions.py`), fenced in its WHERE clause; the
rows it changed come back by RETURNING."""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, insert

from leasehold._server.clock import Clock
from leasehold._server.jobs import schedules, steering
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.admin import AdminFilter
from leasehold._server.jobs.idempotency import RequestKey
from leasehold._server.jobs.operations.rows import Columns
from leasehold._server.jobs.records import FeedEvent, JobEvent, JobSubject, Lease
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql import admin as admin_rows
from leasehold._server.jobs.sql import feed as feed_rows
from leasehold._server.jobs.sql import graphs as graph_rows
from leasehold._server.jobs.sql import queue_view, retention
from leasehold._server.jobs.sql import request_ids as request_rows
from leasehold._server.jobs.sql import schedules as schedule_rows
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql import worker_writes as worker_write_rows
from leasehold._server.jobs.sql.dialect import SqlDialect
from leasehold._server.jobs.sql.tables import jobs
from leasehold._server.jobs.sql.transitions import parameters
from leasehold._server.jobs.sql.writer import WriteTx
from leasehold._server.jobs.worker_writes import WorkerWrite

# The append statement's bound when no event limit is set: more than any sequence.
NO_EVENT_LIMIT = 2**62

# One lease's fenced statements, by transition name.
_SINGLE_LEASE = {**sql.SINGLE_LEASE, sm.CHECKPOINT.name: sql.SAVE_CHECKPOINT}
# A retry names its source, and a job of a graph its place in it, which the
# dialect's bulk insert (a new job's own columns) leaves out.
_INSERT_WHOLE = insert(jobs)
# What the whole insert's rows carry when their own dicts do not: every row
# of one executemany binds the same columns.
_WHOLE_DEFAULTS = {
    "retry_of_job_id": None,
    "has_dependents": False,
    **dict.fromkeys(sm.DEPENDENCY_COLUMNS[:3]),
}
_WHOLE_DEFAULTS["pending_dependencies"] = 0


def _mapped(rows: Iterable[Row[Any]]) -> list[Columns]:
    return [row._mapping for row in rows]


@functools.cache
def _many_lease_statements(dialect: SqlDialect) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per transition name, the dialect's many-lease statement, and the brief
    one (what the runtime's success needs) where there is one."""
    many = dialect.many_leases
    full = {sm.HEARTBEAT.name: many.heartbeat, sm.SUCCEED.name: many.succeed}
    return full, {**full, sm.SUCCEED.name: many.succeed_status}


class SqlRows:
    """One operation's (or one batch of callers') statements, on `tx`."""

    def __init__(self, tx: WriteTx, dialect: SqlDialect, clock: Clock) -> None:
        self._tx = tx
        self._conn = tx.conn
        self._dialect = dialect
        self._clock = clock
        self._many_leases, self._brief_many_leases = _many_lease_statements(dialect)

    def now(self) -> datetime:
        return self._clock.now()

    # ----- new jobs -------------------------------------------------------------------

    def insert_jobs(self, rows: Sequence[Columns]) -> None:
        # The operations hand over the dicts they built (`queued_row`): no copies.
        new = cast(list[dict[str, Any]], rows)
        if any(
            row.get("retry_of_job_id") or row.get("depends_on") or row.get("has_dependents") for row in rows
        ):
            self._conn.execute(_INSERT_WHOLE, [{**_WHOLE_DEFAULTS, **row} for row in rows])
        else:
            self._dialect.bulk_insert(self._conn, "jobs", new)

    def insert_root(self, row: Columns) -> bool:
        return self._conn.execute(self._dialect.insert_if_new, dict(row)).first() is not None

    def latest_for_resource(self, owner_id: str, resource_type: str, resource_id: str) -> Columns:
        params = {"owner": owner_id, "rtype": resource_type, "rid": resource_id}
        return self._conn.execute(sql.LATEST_FOR_RESOURCE, params).one()._mapping

    def insert_events(
        self, events: Sequence[JobEvent], subjects: Mapping[str, JobSubject] | None = None
    ) -> None:
        # Written by the writer's seal, after every operation of the batch.
        self._tx.announce_events(list(events), subjects)

    # ----- the owners' feeds ------------------------------------------------------------

    def feed_subjects(self, job_ids: Sequence[str]) -> dict[str, JobSubject]:
        found = self._conn.execute(feed_rows.SUBJECTS, {"ids": list(job_ids)})
        return {row.id: JobSubject.of(row._mapping) for row in found}

    def advance_feed_heads(self, counts: Mapping[str, int]) -> dict[str, int]:
        moved = self._conn.execute(
            self._dialect.advance_feed_heads,
            [{"owner_id": owner, "last_position": count} for owner, count in counts.items()],
        )
        return {row.owner_id: row.last_position for row in moved}

    def write_events(self, events: Sequence[FeedEvent]) -> None:
        rows = [
            {
                "job_id": e.event.job_id,
                "sequence": e.event.sequence,
                "type": e.event.type,
                "payload": e.event.payload,
                "created_at": e.event.created_at,
                "owner_id": e.subject.owner_id,
                "position": e.position,
            }
            for e in events
        ]
        self._dialect.bulk_insert(self._conn, "job_events", rows)

    def announce_work(self) -> None:
        self._tx.announce_work()

    # ----- graphs of jobs ------------------------------------------------------------

    def lock_parents(self, owner_id: str, job_ids: Sequence[str]) -> dict[str, str]:
        self._dialect.plan_afresh(self._conn)
        found = self._conn.execute(graph_rows.LOCK_PARENTS, {"owner": owner_id, "ids": list(job_ids)})
        return {row.id: row.status for row in found}

    def insert_dependencies(self, edges: Sequence[tuple[str, str]]) -> None:
        self._conn.execute(
            graph_rows.INSERT_EDGES, [{"parent_id": parent, "child_id": child} for parent, child in edges]
        )

    def waiting_children(self, parent_ids: Sequence[str]) -> list[tuple[Columns, str]]:
        statement = graph_rows.WAITING_CHILDREN[self._dialect.locks_rows]
        self._dialect.plan_afresh(self._conn)
        return [
            (row._mapping, row.parent_id) for row in self._conn.execute(statement, {"ids": list(parent_ids)})
        ]

    def write_children(self, children: Sequence[Columns], columns: Sequence[str]) -> None:
        statement = graph_rows.write_children(tuple(columns))
        self._conn.execute(statement, [graph_rows.child_parameters(child, columns) for child in children])

    def parent_results(self, job_ids: Sequence[str]) -> dict[str, Any]:
        self._dialect.plan_afresh(self._conn)
        return {
            row.id: row.result
            for row in self._conn.execute(graph_rows.PARENT_RESULTS, {"ids": list(job_ids)})
        }

    # ----- transitions ----------------------------------------------------------------

    def owned_job(self, owner_id: str, job_id: str) -> Columns | None:
        row = self._conn.execute(sql.GET_JOB_FOR_UPDATE, {"job_id": job_id, "owner": owner_id}).first()
        return None if row is None else row._mapping

    def retry_source(self, owner_id: str, job_id: str) -> Columns | None:
        row = self._conn.execute(sql.GET_SOURCE_FOR_RETRY, {"job_id": job_id, "owner": owner_id}).first()
        return None if row is None else row._mapping

    def transition_owned(
        self, transition: sm.Transition, owner_id: str, job_id: str, inputs: sm.Inputs
    ) -> Columns:
        params = {**parameters(inputs), "job_id": job_id, "owner": owner_id}
        (row,) = self._conn.execute(sql.OWNER_CANCEL[transition.name], params).all()
        return row._mapping

    def transition_leases(
        self, transition: sm.Transition, leases: Sequence[Lease], inputs: sm.Inputs, brief: bool = False
    ) -> list[Columns]:
        many = (self._brief_many_leases if brief else self._many_leases).get(transition.name)
        single = _SINGLE_LEASE.get(transition.name)
        if single is not None and len(leases) == 1 and (many is None or not brief):
            (lease,) = leases
            params = {**parameters(inputs), "job_id": lease.job_id, "token": lease.token}
            return _mapped(self._conn.execute(single, params))
        assert many is not None, f"{transition.name} runs for one lease at a time"
        params = {**parameters(inputs), **self._dialect.lease_parameters(leases, inputs.now)}
        return _mapped(self._conn.execute(many, params))

    def transition_chosen(
        self, transition: sm.Transition, job_ids: Sequence[str], inputs: sm.Inputs
    ) -> list[Columns]:
        assert transition is sm.CLAIM
        params = {**parameters(inputs), **self._dialect.chosen_parameters(list(job_ids))}
        return _mapped(self._conn.execute(self._dialect.claim_chosen, params))

    def transition_found(self, transition: sm.Transition, inputs: sm.Inputs) -> list[Columns]:
        statement = {
            sm.RECOVER_EXPIRED_LEASE.name: self._dialect.recover_expired,
            sm.END_OVERDUE.name: self._dialect.end_overdue,
        }[transition.name]
        return _mapped(self._conn.execute(statement, parameters(inputs)))

    def transition_batch(
        self, transition: sm.Transition, batch: Sequence[Columns], inputs: sm.Inputs
    ) -> list[Columns]:
        params = {**parameters(inputs), "seqs": [row["seq"] for row in batch]}
        return _mapped(self._conn.execute(admin_rows.BULK_CANCEL[transition.name], params))

    def take_event_sequences(
        self, leases: Sequence[Lease], max_events: int | None, now: datetime
    ) -> dict[tuple[str, str], tuple[int, JobSubject]]:
        params = self._dialect.lease_parameters(leases, now)
        params["max_events"] = NO_EVENT_LIMIT if max_events is None else max_events
        rows = self._conn.execute(self._dialect.many_leases.append_event, params)
        return {
            (row.id, row.lease_token): (row.last_event_sequence, JobSubject.of(row._mapping)) for row in rows
        }

    def held_leases(self, leases: Sequence[Lease], now: datetime) -> set[tuple[str, str]]:
        params = self._dialect.lease_parameters(leases, now)
        rows = self._conn.execute(self._dialect.many_leases.cancel_requested, params)
        return {(row.id, row.lease_token) for row in rows}

    # ----- claims ---------------------------------------------------------------------

    def lock_claims(self) -> None:
        self._dialect.lock_claims(self._conn)

    def reanchor_after_clock_step(self, now: datetime) -> None:
        self._conn.execute(sql.REANCHOR_AFTER_CLOCK_STEP, {"now": now})

    def queue_view(self, kinds: KindFilter, now: datetime) -> queue_view.SqlQueueView:
        return queue_view.SqlQueueView(self._conn, self._dialect, kinds, now, self._clock)

    def bucket_tokens(self, rates: Mapping[str, steering.Rate], now: datetime) -> dict[str, float]:
        return queue_view.bucket_tokens(self._conn, rates, now)

    def spend_tokens(self, tokens: Mapping[str, float], spent: Mapping[str, int], now: datetime) -> None:
        queue_view.spend_tokens(self._conn, self._dialect, tokens, spent, now)

    def next_wakeup(self, kinds: KindFilter, now: datetime) -> datetime | None:
        params: dict[str, Any] = {"now": now}
        if kinds.only is not None:
            params["kinds"] = sorted(kinds.only)
        row = self._conn.execute(sql.next_wakeup(kinds.shape), params).one()
        return min((m for m in (row.available, row.expiry) if m is not None), default=None)

    # ----- request ids and worker writes ------------------------------------------

    def take_request_keys(
        self, keys: Sequence[tuple[RequestKey, list[dict[str, Any]]]], now: datetime
    ) -> set[tuple[str, str]]:
        rows = [
            {
                "owner_id": key.owner_id,
                "request_id": key.request_id,
                "method": key.method.value,
                "fingerprint": key.fingerprint,
                "response": response,
                "created_at": now,
            }
            for key, response in keys
        ]
        return {
            (row.owner_id, row.request_id)
            for row in self._conn.execute(self._dialect.insert_request_id, rows)
        }

    def set_request_response(self, key: RequestKey, response: list[dict[str, Any]]) -> None:
        params = {"owner": key.owner_id, "rid": key.request_id, "response": response}
        self._conn.execute(request_rows.SET_RESPONSE, params)

    def request_record(self, key: RequestKey) -> tuple[str, str, list[dict[str, Any]]]:
        found = self._conn.execute(request_rows.FIND, {"owner": key.owner_id, "rid": key.request_id}).one()
        return found.method, found.fingerprint, found.response

    def jobs_named(self, owner_id: str, job_ids: Collection[str]) -> list[Columns]:
        rows = self._conn.execute(request_rows.JOBS_NAMED, {"ids": list(job_ids), "owner": owner_id})
        return [row._mapping for row in rows]

    def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None:
        found = self._conn.execute(worker_write_rows.FIND, worker_write_rows.key(lease, request_key)).first()
        return None if found is None else worker_write_rows.from_row(found._mapping)

    def keep_worker_write(self, record: WorkerWrite) -> None:
        self._conn.execute(worker_write_rows.INSERT, record.row())

    # ----- schedules ---------------------------------------------------------------------

    def insert_schedule(self, schedule: schedules.Schedule) -> schedules.Schedule:
        return schedule_rows.insert_new(self._conn, schedule)

    def owned_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule | None:
        return schedule_rows.owned(self._conn, owner_id, schedule_id, for_update=True)

    def store_schedule(self, schedule: schedules.Schedule) -> None:
        schedule_rows.store(self._conn, schedule)

    def delete_schedule(self, owner_id: str, schedule_id: str) -> bool:
        return bool(
            self._conn.execute(schedule_rows.DELETE, {"owner": owner_id, "sid": schedule_id}).rowcount
        )

    def due_schedules(self, now: datetime, limit: int) -> list[schedules.Schedule]:
        statement = schedule_rows.DUE[self._dialect.locks_rows]
        return [
            schedule_rows.schedule_from_row(row)
            for row in self._conn.execute(statement, {"now": now, "limit": limit})
        ]

    def job_status(self, job_id: str) -> str | None:
        status: str | None = self._conn.execute(schedule_rows.JOB_STATUS, {"job_id": job_id}).scalar()
        return status

    # ----- retention and bulk actions ------------------------------------------------

    def expired_job_ids(self, finished_before: datetime, limit: int) -> list[str]:
        found: list[str] = []
        self._dialect.plan_afresh(self._conn)
        for statement in retention.EXPIRED[self._dialect.locks_rows]:
            remaining = limit - len(found)
            if remaining > 0:
                found.extend(
                    self._conn.execute(statement, {"cutoff": finished_before, "limit": remaining}).scalars()
                )
        return found

    def delete_jobs(self, job_ids: Sequence[str]) -> int:
        doomed = [
            job_id
            for statement in retention.STILL_EXPIRED
            for job_id in self._conn.execute(statement, {"ids": list(job_ids)}).scalars()
        ]
        if not doomed:
            return 0
        expiring = self._conn.execute(feed_rows.EXPIRING, {"ids": doomed}).all()
        self._conn.execute(retention.DELETE_EVENTS, {"ids": doomed})
        deleted: int = self._conn.execute(retention.DELETE_JOBS, {"ids": doomed}).rowcount
        # Last, in owner order, like the numbering: the heads' locks are held
        # for the commit only.
        if expiring:
            self._conn.execute(
                feed_rows.MARK_EXPIRED,
                [{"owner": owner, "through": through} for owner, through in expiring],
            )
        return deleted

    def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        params = {"cutoff": created_before, "last": limit - 1}
        forgotten: int = self._conn.execute(request_rows.FORGET, params).rowcount
        return forgotten

    def bulk_batch(
        self, job_filter: AdminFilter, below: int | None, limit: int, unretried: bool, lock: bool
    ) -> list[Columns]:
        statement = admin_rows.batch(
            job_filter, unretried, lock and self._dialect.locks_rows, whole_rows=unretried
        )
        return [
            row._mapping for row in self._conn.execute(statement, admin_rows.batch_parameters(below, limit))
        ]

    def retried_among(self, job_ids: Sequence[str]) -> set[str]:
        return set(self._conn.execute(admin_rows.RETRIED_AMONG, {"ids": list(job_ids)}).scalars())

    def pause_kind(self, kind: str, now: datetime) -> None:
        self._conn.execute(self._dialect.insert_paused_kind, {"kind": kind, "paused_at": now})

    def resume_kind(self, kind: str) -> bool:
        return bool(self._conn.execute(admin_rows.RESUME, {"kind": kind}).rowcount)

"""A worker's side of the operations: claims (steering's choice, the lease,
the wake-up), renewals, checkpoints, finishing writes and progress events,
and recovering expired or overdue attempts."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from leasehold._server.jobs import ids, limits, steering, worker_writes
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import (
    EventLimitReached,
    LeaseLost,
)
from leasehold._server.jobs.operations.base import Many, rounds
from leasehold._server.jobs.operations.graphs import GraphOperations
from leasehold._server.jobs.operations.rows import Columns, RecoveryDue, Rows
from leasehold._server.jobs.records import (
    ClaimedJob,
    ClaimResult,
    Job,
    JobEvent,
    JobStatus,
    JobSubject,
    JsonObject,
    Lease,
    LeaseRenewal,
    RecoveredJob,
)
from leasehold._server.jobs.routing import ANY_KIND, KindFilter
from leasehold._server.jobs.waits import first_of

T = TypeVar("T")

# A recovery asked for by itself (not by a claim) runs both, unprobed.
_RECOVER_BOTH = RecoveryDue(expired=True, overdue=True)


@dataclass(frozen=True)
class _Append:
    lease: Lease
    event_type: str
    payload: JsonObject


class AttemptOperations(GraphOperations):
    """Claim, renew, checkpoint, finish and report on an attempt, and recover
    the attempts whose worker went away or overstayed."""

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        self._watch_other_writers()
        result, started = await self._write(self._claim_op(worker_id, limit, lease_seconds, kinds))
        # Only a committed claim moves the mark, so a rolled-back re-anchor is
        # redone. After a re-anchor nothing is stamped later than `started`.
        self._claim_clock_high_water = started
        return result

    async def claim_with_next_work(
        self,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        kinds: KindFilter,
        give_up: asyncio.Event,
        timeout: float,
    ) -> ClaimResult | None:
        # The claim rides in the next write that makes work claimable: its
        # unit of work, its commit.
        self._watch_other_writers()
        waiting = self._write_on_next_work(self._claim_op(worker_id, limit, lease_seconds, kinds))
        try:
            outcome = await first_of(waiting.result(), give_up, timeout)
        except asyncio.CancelledError:
            # Nobody will run what a write may already have claimed: give it back.
            late = await asyncio.shield(waiting.withdraw())
            if late is not None:
                await asyncio.shield(self._hand_back(late[0]))
            raise
        if outcome is None:
            # A write may have made it while the wait was being given up: its
            # jobs are leased, so they are this caller's.
            outcome = await waiting.withdraw()
        if outcome is None:
            return None
        result, started = outcome
        self._claim_clock_high_water = started
        return result

    async def _hand_back(self, result: ClaimResult) -> None:
        await asyncio.gather(
            *(self.release(claimed.lease) for claimed in result.jobs), return_exceptions=True
        )

    def _claim_op(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter
    ) -> Callable[[Rows], tuple[ClaimResult, datetime]]:
        high_water = self._claim_clock_high_water

        def op(rows: Rows) -> tuple[ClaimResult, datetime]:
            if self._steering.has_limits:
                # Before the time is read: a claim that waited for another to
                # commit counts leases, and stamps its starts, from after that.
                rows.lock_claims()
            now = rows.now()
            if high_water is None or now < high_water:
                # First claim of this process (perhaps after a snapshot restore), or
                # the wall clock went back since the last one: only then can queued
                # jobs carry stamps from the future. Checking walks every job in
                # backoff, so it stays off the hot path otherwise.
                rows.reanchor_after_clock_step(now)
            view = rows.queue_view(kinds, now)
            if self._steering.has_limits:
                # Counted first, so the starts are stamped (from `counted_at`)
                # close to when their slots were seen free. A job this claim's
                # recovery ends past its deadline still counts: this claim is
                # cautious, the next one sees the slot.
                view.running()
            expired = self._recover_rows(rows, now, view.recovery_due())
            if expired:
                view.recovered()
            claimed, rate_wakeup, started = self._lease_due(rows, view, worker_id, limit, lease_seconds, now)
            # A claim that filled its limit is made again at once: no wake-up to find.
            later = None if len(claimed) == limit else rows.next_wakeup(kinds, now)
            result = ClaimResult(
                jobs=claimed,
                next_wakeup_at=min((m for m in (later, rate_wakeup) if m is not None), default=None),
                recovered=expired,
            )
            return result, started

        return op

    def _lease_due(
        self,
        rows: Rows,
        view: Any,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        now: datetime,
    ) -> tuple[list[ClaimedJob], datetime | None, datetime]:
        """Lease the jobs `steering.choose` deals this claim; also answers when
        a rate-limited kind next has a token, if one ran out, and the time the
        starts are stamped with."""
        if limit <= 0:
            return [], None, now
        rules = self._steering
        tokens = rows.bucket_tokens(rules.kind_rates, now)
        choice = steering.choose(view, rules, limit, self._fair_share_cursor, tokens)
        self._fair_share_cursor = choice.cursor
        rows.spend_tokens(tokens, choice.rate_spent, now)
        rate_wakeup = steering.rate_wakeup(tokens, choice.rate_spent, rules.kind_rates, now)
        if not choice.job_ids:
            return [], rate_wakeup, now
        # Starts dealt from running counts are stamped after the counts were
        # read. An attempt another process ended is stamped before its commit,
        # so one this claim saw ended carries an earlier time than the starts
        # that took its slot: the event log never shows more running than a
        # limit allowed.
        counted_at = view.counted_at
        started = now if counted_at is None else max(now, counted_at)
        # One token for the whole claim: fencing is per (job id, token), and every
        # claim draws a fresh one, so no other attempt of these jobs can hold it.
        token = ids.new_lease_token()
        expires_at = started + timedelta(seconds=lease_seconds)
        inputs = sm.Inputs(now=started, worker=worker_id, token=token, expires_at=expires_at)
        changed = rows.transition_chosen(sm.CLAIM, choice.job_ids, inputs)
        self._written(rows, sm.CLAIM, changed, started)
        # The rows come back in no order: put them back in the order they were dealt in.
        dealt = {job_id: place for place, job_id in enumerate(choice.job_ids)}
        changed.sort(key=lambda row: dealt[row["id"]])
        parent_results = self._parent_results(rows, changed)
        claimed = [
            ClaimedJob(
                job=sm.job_of(row),
                payload=row["payload"],
                lease=Lease(job_id=row["id"], token=token, attempt=row["attempt"]),
                lease_expires_at=expires_at,
                checkpoint=row["checkpoint"],
                parent_results=parent_results.get(row["id"], {}),
            )
            for row in changed
        ]
        return claimed, rate_wakeup, started

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        return await self._write(lambda rows: self._recover_rows(rows, rows.now(), _RECOVER_BOTH))

    def _recover_rows(self, rows: Rows, now: datetime, due: RecoveryDue) -> list[RecoveredJob]:
        """Expired leases first: an attempt whose worker stopped heartbeating
        ended because the worker went away, whatever deadline it also passed;
        what is left overdue still has a live worker, which must be stopped.
        `due` says which of the two have work (a recovery with none is skipped)."""
        recovered: list[RecoveredJob] = []
        for transition, lease_expired, wanted in (
            (sm.RECOVER_EXPIRED_LEASE, True, due.expired),
            (sm.END_OVERDUE, False, due.overdue),
        ):
            if not wanted:
                continue
            jitter = self._jitter() if transition.backs_off else 0.0
            changed = rows.transition_found(transition, sm.Inputs(now=now, jitter=jitter))
            self._written(rows, transition, changed, now)
            recovered.extend(
                RecoveredJob(row["id"], row["kind"], JobStatus(row["status"]), lease_expired=lease_expired)
                for row in changed
            )
        return recovered

    # ----- serving a worker's lease -------------------------------------------------------

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        return (await self._write_many(self._renewals(lease_seconds), lease)).expires_at

    async def heartbeat(self, leases: list[Lease], lease_seconds: float) -> list[LeaseRenewal | None]:
        # Each lease joins the current batch of renewals: however many workers
        # heartbeat at once, a batch is one statement.
        renewals = self._renewals(lease_seconds)
        answers = await asyncio.gather(
            *(self._write_many(renewals, lease) for lease in leases), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, LeaseLost):
                raise answer
        return [answer if isinstance(answer, LeaseRenewal) else None for answer in answers]

    def _renewals(self, lease_seconds: float) -> Many[Lease, LeaseRenewal]:
        # Heartbeats of jobs claimed together fall due together: one statement
        # renews every lease of the same length whose heartbeat reached a batch.
        return Many(f"renew:{lease_seconds!r}", functools.partial(self._renew_rows, lease_seconds))

    def _renew_rows(
        self, lease_seconds: float, rows: Rows, leases: list[Lease]
    ) -> list[LeaseRenewal | Exception]:
        now = rows.now()
        expires_at = now + timedelta(seconds=lease_seconds)
        inputs = sm.Inputs(now=now, expires_at=expires_at)
        answers: dict[int, LeaseRenewal | Exception] = {}
        for this_round in rounds(leases, lambda lease: lease.job_id):
            batch = [lease for _, lease in this_round.values()]
            changed = rows.transition_leases(sm.HEARTBEAT, batch, inputs, brief=True)
            renewed = {row["id"]: row["cancel_requested_at"] is not None for row in changed}
            for job_id, (index, _) in this_round.items():
                answers[index] = (
                    LeaseRenewal(expires_at, renewed[job_id]) if job_id in renewed else LeaseLost(job_id)
                )
        return [answers[index] for index in range(len(leases))]

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        def op(rows: Rows) -> LeaseRenewal:
            now = rows.now()
            expires_at = now + timedelta(seconds=lease_seconds)
            inputs = sm.Inputs(now=now, expires_at=expires_at, checkpoint=checkpoint)
            changed = rows.transition_leases(sm.CHECKPOINT, [lease], inputs, brief=True)
            if not changed:
                raise LeaseLost(lease.job_id)
            return LeaseRenewal(expires_at, changed[0]["cancel_requested_at"] is not None)

        return await self._write(op)

    async def succeed(self, lease: Lease, result: JsonObject | None = None, remember: bool = False) -> Job:
        if result is None and not remember:
            # The common case, and the same statement for every lease: successes
            # that queue together are one UPDATE.
            return await self._write_many(Many(sm.SUCCEED.name, self._succeed_rows), lease)
        return await self._finish(sm.SUCCEED, lease, lambda now: sm.Inputs(now=now, result=result), remember)

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        """`succeed`, answering only the status the job ended in (SUCCEEDED, or
        CANCELLED when a cancel request won): what the runtime needs, without
        reading back and building the whole job."""
        if result is None:
            return await self._write_many(Many("succeed_status", self._succeed_status_rows), lease)
        return (await self.succeed(lease, result)).status

    def _succeed_rows(self, rows: Rows, leases: list[Lease]) -> list[Job | Exception]:
        return self._succeed_leases(rows, leases, brief=False, answer=sm.job_of)

    def _succeed_status_rows(self, rows: Rows, leases: list[Lease]) -> list[JobStatus | Exception]:
        return self._succeed_leases(rows, leases, brief=True, answer=lambda row: JobStatus(row["status"]))

    def _succeed_leases(
        self, rows: Rows, leases: list[Lease], brief: bool, answer: Callable[[Columns], T]
    ) -> list[T | Exception]:
        answers: dict[int, T | Exception] = {}
        for this_round in rounds(leases, lambda lease: lease.job_id):
            now = rows.now()
            batch = [lease for _, lease in this_round.values()]
            changed = rows.transition_leases(sm.SUCCEED, batch, sm.Inputs(now=now), brief=brief)
            self._written(rows, sm.SUCCEED, changed, now)
            done = {row["id"]: answer(row) for row in changed}
            for job_id, (index, _) in this_round.items():
                found = done.get(job_id)
                answers[index] = LeaseLost(job_id) if found is None else found
        return [answers[index] for index in range(len(leases))]

    async def fail(
        self,
        lease: Lease,
        error: str,
        retryable: bool = True,
        error_type: str | None = None,
        retry_after_seconds: float | None = None,
        remember: bool = False,
    ) -> Job:
        def inputs(now: datetime) -> sm.Inputs:
            return sm.Inputs(
                now=now,
                jitter=self._jitter(),
                retryable=retryable,
                error=limits.storable_error(error),
                error_type=limits.storable_error_type(error_type),
                retry_at=sm.requested_retry_at(now, retry_after_seconds),
            )

        return await self._finish(sm.FAIL, lease, inputs, remember)

    async def snooze(self, lease: Lease, delay_seconds: float, remember: bool = False) -> Job:
        def inputs(now: datetime) -> sm.Inputs:
            return sm.Inputs(now=now, retry_at=now + timedelta(seconds=delay_seconds))

        return await self._finish(sm.SNOOZE, lease, inputs, remember)

    async def release(self, lease: Lease) -> Job:
        """Give the attempt back unfinished (the worker is shutting down): the job is
        claimable again at once, and the interrupted attempt does not count."""
        return await self._finish(sm.RELEASE, lease, lambda now: sm.Inputs(now=now))

    async def mark_cancelled(self, lease: Lease, remember: bool = False) -> Job:
        return await self._finish(sm.CONFIRM_CANCEL, lease, lambda now: sm.Inputs(now=now), remember)

    async def _finish(
        self,
        transition: sm.Transition,
        lease: Lease,
        inputs: Callable[[datetime], sm.Inputs],
        remember: bool = False,
    ) -> Job:
        """One fenced transition of the attempt `lease` holds, with its events
        (and, to `remember` it, the write's record in the same unit of work)."""

        def op(rows: Rows) -> Job:
            now = rows.now()
            changed = rows.transition_leases(transition, [lease], inputs(now))
            if not changed:
                raise LeaseLost(lease.job_id)
            self._written(rows, transition, changed, now)
            job = sm.job_of(changed[0])
            if remember:
                rows.keep_worker_write(worker_writes.finished(lease, transition, job, now))
            return job

        return await self._write(op)

    async def append_event(
        self, lease: Lease, event_type: str, payload: JsonObject, request_id: str | None = None
    ) -> JobEvent:
        append = _Append(lease, event_type, payload)
        if request_id is None:
            # Jobs that report progress together append together: every event of a
            # batch takes its sequence in one UPDATE and goes in with one INSERT.
            return await self._write_many(Many("append", self._append_rows), append)

        def op(rows: Rows) -> JobEvent:
            stored = rows.worker_write(lease, request_id)
            if stored is not None:
                return worker_writes.replay_append(stored, request_id, event_type, payload)
            (answer,) = self._append_rows(rows, [append])
            if isinstance(answer, Exception):
                raise answer
            rows.keep_worker_write(worker_writes.appended(lease, request_id, answer))
            return answer

        return await self._write(op)

    def _append_rows(self, rows: Rows, appends: list[_Append]) -> list[JobEvent | Exception]:
        now = rows.now()
        answers: dict[int, JobEvent | Exception] = {}
        events: list[JobEvent] = []
        subjects: dict[str, JobSubject] = {}
        for this_round in rounds(appends, lambda append: append.lease.job_id):
            leases = [append.lease for _, append in this_round.values()]
            taken = rows.take_event_sequences(leases, self._max_events, now)
            missed = [lease for lease in leases if (lease.job_id, lease.token) not in taken]
            # No sequence for a lease that holds its job: its log is full.
            full = rows.held_leases(missed, now) if missed and self._max_events is not None else set()
            for index, append in this_round.values():
                lease = append.lease
                found = taken.get((lease.job_id, lease.token))
                if found is None:
                    answers[index] = (
                        EventLimitReached(lease.job_id, self._max_events or 0)
                        if (lease.job_id, lease.token) in full
                        else LeaseLost(lease.job_id)
                    )
                    continue
                sequence, subjects[lease.job_id] = found
                event = JobEvent(lease.job_id, sequence, append.event_type, append.payload, now)
                events.append(event)
                answers[index] = event
        if events:
            rows.insert_events(events, subjects)
        return [answers[index] for index in range(len(appends))]

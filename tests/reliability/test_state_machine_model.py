"""Experiment 1: a model-based test of the job state machine (DESIGN §3).

Hypothesis drives random sequences of enqueue (with and without a resource key),
claim, heartbeat, succeed, fail, release, cancel, retry, event appends and clock
jumps against the real repository on a real database, and against a small
pure-Python model of the rules. Leases from earlier attempts stay in play, so
stale-token calls are exercised all the time. After every step each job's status,
attempt, error and event log must match. A mutant that returns a resource's first
job instead of its most recent, or one without the lease-expiry check, is caught.

Both engines, each example on a fresh database: 100 runs of 50 steps on a SQLite
file; on PostgreSQL (a database copied from the migrated template per run, dropped
after it) fewer runs, as every step there is several round trips to another
process. The clock is the test's own: a statement that compared leases with the
database's clock instead of the one it was given would fail the model at once.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import state_machine as job_rules
from leasehold._server.jobs.errors import JobNotFound, RetryNotAllowed
from leasehold._server.jobs.records import JobStatus, Lease, NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold.worker import LeaseLost
from tests.reliability.conftest import Figures, NewDatabase
from tests.support import OWNER, make_repository

LEASE_SECONDS = 30.0


@dataclass
class ModelJob:
    id: str
    seq: int
    max_attempts: int
    resource_id: str | None = None
    status: JobStatus = JobStatus.QUEUED
    attempt: int = 0
    available_at: datetime | None = None
    cancel_requested: bool = False
    token: str | None = None
    lease_expires_at: datetime | None = None
    error: str | None = None
    events: list[str] = field(default_factory=lambda: ["job.queued"])


class JobStateMachine(RuleBasedStateMachine):
    leases = Bundle("leases")
    jobs = Bundle("jobs")

    def __init__(self, database: NewDatabase) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = Path(tempfile.mkdtemp(prefix="leasehold-model-"))
        self.database = database
        self.database_url = database(self.directory)
        self.clock = ManualClock()
        self.repository: JobRepository = self.run(make_repository(self.database_url, self.clock))
        self.model: dict[str, ModelJob] = {}
        self.next_seq = 0

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def teardown(self) -> None:
        self.run(self.repository.close())
        self.loop.close()
        self.database.discard(self.database_url)
        shutil.rmtree(self.directory, ignore_errors=True)

    # ----- the model's rules ------------------------------------------------------------

    def _now(self) -> datetime:
        return self.clock.now()

    def _add(self, job_id: str, max_attempts: int, resource_id: str | None = None) -> ModelJob:
        self.next_seq += 1
        job = ModelJob(
            id=job_id,
            seq=self.next_seq,
            max_attempts=max_attempts,
            resource_id=resource_id,
            available_at=self._now(),
        )
        self.model[job_id] = job
        return job

    def _lease_valid(self, lease: Lease) -> bool:
        job = self.model[lease.job_id]
        return (
            job.status is JobStatus.RUNNING
            and job.token == lease.token
            and job.lease_expires_at is not None
            and job.lease_expires_at > self._now()
        )

    def _end_attempt(self, job: ModelJob) -> None:
        job.token = None
        job.lease_expires_at = None

    def _recover_expired(self) -> None:
        for job in self.model.values():
            if job.status is not JobStatus.RUNNING or job.lease_expires_at is None:
                continue
            if job.lease_expires_at > self._now():
                continue
            self._end_attempt(job)
            job.events.append("job.lease_expired")
            if job.cancel_requested:
                job.status = JobStatus.CANCELLED
                job.events.append("job.cancelled")
            elif job.attempt >= job.max_attempts:
                job.status = JobStatus.FAILED
                job.error = job_rules.LEASE_EXPIRED_ERROR_TEXT
                job.events.append("job.failed")
            else:
                job.status = JobStatus.QUEUED
                job.available_at = self._now()

    # ----- rules ------------------------------------------------------------------------

    @rule(target=jobs, max_attempts=st.integers(1, 3), resource_id=st.sampled_from([None, None, "r1", "r2"]))
    def enqueue(self, max_attempts: int, resource_id: str | None) -> str:
        job, created = self.run(
            self.repository.enqueue(
                NewJob(
                    owner_id=OWNER,
                    kind="example.echo",
                    payload={},
                    max_attempts=max_attempts,
                    resource_type="doc" if resource_id else "",
                    resource_id=resource_id or "",
                )
            )
        )
        same_resource = [m for m in self.model.values() if resource_id and m.resource_id == resource_id]
        if same_resource:
            # Dedup: the resource's most recent job (its root or a later retry).
            assert not created
            assert job.id == max(same_resource, key=lambda m: m.seq).id
            return job.id
        assert created
        self._add(job.id, max_attempts, resource_id)
        return job.id

    @rule(target=leases, limit=st.integers(1, 3))
    def claim(self, limit: int) -> Any:
        result = self.run(self.repository.claim("worker", limit, LEASE_SECONDS))
        self._recover_expired()
        due = sorted(
            (
                job
                for job in self.model.values()
                if job.status is JobStatus.QUEUED
                and job.available_at is not None
                and job.available_at <= self._now()
            ),
            key=lambda job: (job.available_at, job.seq),
        )[:limit]
        assert [c.job.id for c in result.jobs] == [job.id for job in due]
        for claimed in result.jobs:
            job = self.model[claimed.job.id]
            job.status = JobStatus.RUNNING
            job.attempt += 1
            job.token = claimed.lease.token
            job.lease_expires_at = self._now() + timedelta(seconds=LEASE_SECONDS)
            job.events.append("job.started")
            assert claimed.lease.attempt == job.attempt
        return multiple(*(claimed.lease for claimed in result.jobs))

    @rule(seconds=st.sampled_from([0.5, 1, 2, 5, 15, 29, 31, 60]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def _worker_call(self, lease: Lease, call: Any) -> Any:
        valid = self._lease_valid(lease)
        try:
            outcome = self.run(call)
        except LeaseLost:
            assert not valid, "a valid lease was rejected"
            return None
        assert valid, "a stale lease was accepted"
        return outcome

    @rule(lease=leases)
    def heartbeat(self, lease: Lease) -> None:
        if self._worker_call(lease, self.repository.renew(lease, LEASE_SECONDS)) is not None:
            self.model[lease.job_id].lease_expires_at = self._now() + timedelta(seconds=LEASE_SECONDS)

    @rule(lease=leases)
    def succeed(self, lease: Lease) -> None:
        if self._worker_call(lease, self.repository.succeed(lease)) is None:
            return
        job = self.model[lease.job_id]
        self._end_attempt(job)
        if job.cancel_requested:
            job.status = JobStatus.CANCELLED
            job.events.append("job.cancelled")
        else:
            job.status = JobStatus.SUCCEEDED
            job.error = None
            job.events.append("job.succeeded")

    @rule(lease=leases, retryable=st.booleans())
    def fail(self, lease: Lease, retryable: bool) -> None:
        if self._worker_call(lease, self.repository.fail(lease, "boom", retryable)) is None:
            return
        job = self.model[lease.job_id]
        self._end_attempt(job)
        job.error = "boom"
        if retryable and job.attempt < job.max_attempts and not job.cancel_requested:
            job.status = JobStatus.QUEUED
            job.available_at = self._now() + timedelta(seconds=job_rules.backoff_seconds(job.attempt))
            job.events.append("job.retry_scheduled")
        else:
            job.status = JobStatus.FAILED
            job.events.append("job.failed")

    @rule(lease=leases)
    def mark_cancelled(self, lease: Lease) -> None:
        if self._worker_call(lease, self.repository.mark_cancelled(lease)) is None:
            return
        job = self.model[lease.job_id]
        self._end_attempt(job)
        job.status = JobStatus.CANCELLED
        job.events.append("job.cancelled")

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        if self._worker_call(lease, self.repository.release(lease)) is None:
            return
        job = self.model[lease.job_id]
        self._end_attempt(job)
        job.status = JobStatus.QUEUED
        job.attempt -= 1
        job.available_at = self._now()
        job.events.append("job.released")

    @rule(lease=leases)
    def append_event(self, lease: Lease) -> None:
        if self._worker_call(lease, self.repository.append_event(lease, "step", {})) is not None:
            self.model[lease.job_id].events.append("step")

    @rule(lease=leases)
    def check_cancel(self, lease: Lease) -> None:
        requested = self._worker_call(lease, self.repository.cancel_requested(lease))
        if requested is not None:
            assert requested is self.model[lease.job_id].cancel_requested

    @rule(job_id=jobs)
    def cancel(self, job_id: str) -> None:
        self.run(self.repository.cancel(OWNER, job_id))
        job = self.model[job_id]
        if job.status is JobStatus.QUEUED:
            job.status = JobStatus.CANCELLED
            job.events.append("job.cancelled")
        elif job.status is JobStatus.RUNNING and not job.cancel_requested:
            job.cancel_requested = True
            job.events.append("job.cancel_requested")

    @rule(target=jobs, job_id=jobs)
    def retry(self, job_id: str) -> Any:
        source = self.model[job_id]
        try:
            child = self.run(self.repository.retry(OWNER, job_id))
        except RetryNotAllowed:
            assert source.status not in (JobStatus.FAILED, JobStatus.CANCELLED)
            return multiple()
        assert source.status in (JobStatus.FAILED, JobStatus.CANCELLED)
        assert child.retry_of_job_id == job_id
        self._add(child.id, source.max_attempts, source.resource_id)
        return child.id

    @rule(job_id=jobs)
    def another_owner_sees_nothing(self, job_id: str) -> None:
        try:
            self.run(self.repository.get("mallory", job_id))
        except JobNotFound:
            return
        raise AssertionError("another owner could read the job")

    # ----- the comparison -----------------------------------------------------------------

    @invariant()
    def repository_matches_the_model(self) -> None:
        for job_id, expected in self.model.items():
            actual = self.run(self.repository.get(OWNER, job_id))
            assert (actual.status, actual.attempt) == (expected.status, expected.attempt), job_id
            assert (actual.cancel_requested_at is not None) == expected.cancel_requested
            assert actual.error_message == expected.error
            if expected.status is JobStatus.QUEUED:
                assert actual.available_at == expected.available_at
            events = self.run(self.repository.list_events(OWNER, job_id, 0, 10_000))
            assert [e.type for e in events] == expected.events
            assert [e.sequence for e in events] == list(range(1, len(events) + 1))


# Runs of 50 steps per engine: 100 on SQLite; on PostgreSQL a step costs several
# round trips (an invariant reads every job and its log), so fewer runs keep the
# variant near a minute.
RUNS = {"sqlite": 100, "postgresql": 60}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_repository_follows_the_model(new_database: NewDatabase, figures: Figures) -> None:
    runs = RUNS[new_database.engine]

    class OnThisEngine(JobStateMachine):
        made = 0

        def __init__(self) -> None:
            OnThisEngine.made += 1
            super().__init__(new_database)

    run_state_machine_as_test(
        OnThisEngine,
        settings=settings(
            max_examples=runs,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    # Each run had a database of its own (hypothesis may also replay a failure).
    assert OnThisEngine.made >= runs, OnThisEngine.made
    figures("runs of 50 steps", OnThisEngine.made)

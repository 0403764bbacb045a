"""Experiment 5 — event sequences under concurrent appenders (DESIGN §4).

Promise: each job has one ordered, gap-free log (1, 2, 3 …), whoever writes to it
and however many write at once; an acknowledged event is in the log exactly once;
a subscriber sees the log in sequence order with no gap and no duplicate.

How it could fail: sequences computed outside the write transaction (read max, then
insert) collide or leave holes when appends race; a group commit could hand out a
sequence, fail, and leave a hole; a retried append after a failed commit could land
twice; a live watcher woken by one commit could read past a sequence another
connection has reserved but not yet committed.

How: inside running jobs, 20 tasks each append K events at once (`stream.fanout`,
tests/reliability/stream_handlers.py), with every event carrying an id; five jobs
run together. A gRPC watcher subscribes from sequence 0 before the first append and
follows live. Afterwards the log is read straight from the database and checked
against the watcher's copy and the appenders' acknowledgements. Every test runs
on both engines. Variants: a seeded 5 % of COMMITs fail (refused appends are
retried -- by the job context itself, server/runtime/storage_retry.py, and by the handler
should that give up; the fault strikes before COMMIT, so a retry must not
duplicate), and appenders split across two `SqlJobRepository` instances on one
database sharing one lease, as two processes (or two replicas) would, watched
through a third instance that learns of new events only from the other writers'
commits: on SQLite by polling the file's change counter, on PostgreSQL by
LISTEN/NOTIFY.

Checked per job: sequences exactly 1..N (N = lifecycle events + 20·K); every event id
once; each appender's events in its call order; each acknowledgement names the
sequence the event has in the database, one appender's acknowledgements rise, and an
append acknowledged before another was issued has the smaller sequence; every
watcher's copy equals the stored log, received in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from google.protobuf import json_format

from leasehold._server import migrate
from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import SystemClock
from leasehold._server.jobs.errors import StorageUnavailable
from leasehold._server.jobs.records import JobEvent, Lease, NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.watch import follow_events
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from leasehold.worker import HandlerRegistry
from tests import database_reads
from tests.api.helpers import struct
from tests.reliability.conftest import Figures
from tests.reliability.faults import CommitFaults, commit_faults, retry_unavailable
from tests.reliability.stream_handlers import FAN_EVENT, FANOUT, Ack, StreamHandlers
from tests.support import OWNER, owner_metadata, test_registry

JOBS = 5
APPENDERS = 20
PER_APPENDER = 25
FAULT_RATE = 0.05
FAULT_SEED = 5
MAX_TRIES = 40
WATCH_SECONDS = 45.0
LIFECYCLE_WITHOUT_FAULTS = ["job.queued", "job.started", "job.succeeded"]

T = TypeVar("T")
Stub = jobs_pb2_grpc.JobServiceStub
# (sequence, type, payload) of one event.
Entry = tuple[int, str, dict[str, Any]]


@pytest.fixture
def handlers() -> StreamHandlers:
    return StreamHandlers()


@pytest.fixture
def registry(handlers: StreamHandlers) -> HandlerRegistry:
    """The `app` fixture serves the stream kinds too."""
    registry = test_registry()
    handlers.register(registry)
    return registry


@pytest.fixture
def runtime_settings() -> RuntimeSettings:
    """A slot for every job of the experiment."""
    return RuntimeSettings(concurrency=JOBS + 1, lease_seconds=6, poll_seconds=0.05)


# ----- retrying like a client ---------------------------------------------------------


async def retrying(call: Callable[[], Awaitable[T]]) -> T:
    """Run `call`, again after StorageUnavailable (a failed commit leaves nothing)."""
    for _ in range(MAX_TRIES - 1):
        try:
            return await call()
        except StorageUnavailable:
            await asyncio.sleep(0.005)
    return await call()


async def enqueue_retrying(stub: Stub, payload: dict[str, Any]) -> str:
    """Enqueue over gRPC, again after UNAVAILABLE (and only after it)."""
    request = jobs_pb2.EnqueueRequest(kind=FANOUT, payload=struct(payload))
    response = await retry_unavailable(
        lambda: stub.Enqueue(request, metadata=owner_metadata(), timeout=20), tries=MAX_TRIES
    )
    return response.job.id


# ----- watching -----------------------------------------------------------------------


@dataclass
class Watcher:
    """A subscriber from sequence 0: what it received and how its stream ended."""

    received: list[Entry]
    started: asyncio.Event
    task: asyncio.Task[str]


def grpc_watcher(stub: Stub, job_id: str) -> Watcher:
    received: list[Entry] = []
    started = asyncio.Event()

    async def follow() -> str:
        call = stub.WatchEvents(
            jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=0), metadata=owner_metadata()
        )
        try:
            async for response in call:
                event = response.event
                received.append((event.sequence, event.type, json_format.MessageToDict(event.payload)))
                if event.type == "job.started":
                    started.set()
        finally:
            call.cancel()
        return (await call.code()).name

    return Watcher(received, started, asyncio.create_task(follow()))


def repository_watcher(repository: SqlJobRepository, job_id: str) -> Watcher:
    """Follows the log through `follow_events` on `repository`, as WatchEvents does."""
    received: list[Entry] = []
    started = asyncio.Event()

    async def follow() -> str:
        async for event in follow_events(repository, OWNER, job_id, 0):
            received.append((event.sequence, event.type, event.payload))
            if event.type == "job.started":
                started.set()
        return "OK"

    return Watcher(received, started, asyncio.create_task(follow()))


async def finish(watchers: list[Watcher]) -> None:
    async with asyncio.timeout(WATCH_SECONDS):
        codes = await asyncio.gather(*(watcher.task for watcher in watchers))
    assert set(codes) == {"OK"}, codes


# ----- the checks ---------------------------------------------------------------------


def stored_log(database_url: str, job_id: str) -> list[Entry]:
    """The job's log as it is in the database."""
    found = database_reads.rows(
        database_url,
        "SELECT sequence, type, payload FROM job_events WHERE job_id = :job_id ORDER BY sequence",
        job_id=job_id,
    )
    return [(row["sequence"], row["type"], database_reads.json_column(row["payload"])) for row in found]


def check_log(log: list[Entry], watchers: list[list[Entry]], acks: list[Ack], exact_lifecycle: bool) -> int:
    """Every property of one job's log; returns its length N."""
    sequences = [sequence for sequence, _, _ in log]
    assert sequences == list(range(1, len(log) + 1)), "the log has a gap or a duplicate"

    fan = [payload for _, kind, payload in log if kind == FAN_EVENT]
    lifecycle = [kind for _, kind, _ in log if kind != FAN_EVENT]
    assert all(kind.startswith("job.") for kind in lifecycle), lifecycle
    assert len(log) == len(lifecycle) + APPENDERS * PER_APPENDER
    if exact_lifecycle:
        assert lifecycle == LIFECYCLE_WITHOUT_FAULTS, lifecycle
    assert lifecycle[0] == "job.queued" and lifecycle[-1] == "job.succeeded", lifecycle
    assert log[-1][1] == "job.succeeded"

    # Each logical event exactly once.
    counts = Counter(payload["id"] for payload in fan)
    expected = {f"{a}:{i}" for a in range(APPENDERS) for i in range(PER_APPENDER)}
    assert set(counts) == expected
    assert [event_id for event_id, n in counts.items() if n != 1] == []

    # Each appender's events in its own call order.
    for appender in range(APPENDERS):
        indexes = [payload["index"] for payload in fan if payload["appender"] == appender]
        assert indexes == list(range(PER_APPENDER)), (appender, indexes)

    # What each append was told is what the log holds.
    position = {payload["id"]: sequence for sequence, kind, payload in log if kind == FAN_EVENT}
    assert sorted(ack.event_id for ack in acks) == sorted(expected)
    assert {ack.event_id: ack.sequence for ack in acks} == position
    # One appender's acknowledgements come in sequence order.
    for appender in range(APPENDERS):
        own = sorted((ack for ack in acks if ack.appender == appender), key=lambda ack: ack.acked)
        assert [ack.index for ack in own] == list(range(PER_APPENDER))
        assert all(a.sequence < b.sequence for a, b in zip(own, own[1:], strict=False))
    check_real_time_order(acks)

    # Subscribers saw exactly the log, in commit order.
    for received in watchers:
        assert received == log, "a watcher's copy differs from the stored log"
    return len(log)


def check_real_time_order(acks: list[Ack]) -> None:
    """Across appenders: an append acknowledged before another was issued has the
    smaller sequence (acknowledged means committed, and sequences follow commits)."""
    by_ack = sorted(acks, key=lambda ack: ack.acked)
    done, highest = 0, 0
    for ack in sorted(acks, key=lambda ack: ack.issued):
        while done < len(by_ack) and by_ack[done].acked < ack.issued:
            highest = max(highest, by_ack[done].sequence)
            done += 1
        assert highest < ack.sequence, f"{ack} was issued after sequence {highest} was acknowledged"


def report(figures: Figures, lengths: list[int], acks: list[Ack]) -> None:
    latencies = [ack.acked - ack.issued for ack in acks]
    figures("jobs", len(lengths))
    figures("appenders x events per job", f"{APPENDERS}x{PER_APPENDER}")
    figures("events checked", sum(lengths))
    figures("append p50 s", statistics.median(latencies))
    figures("append max s", max(latencies))


@dataclass
class AppendProbe:
    """Counts the appends the repository refused with StorageUnavailable. It wraps
    the running app's `append_event` and passes every call through unchanged: the
    runtime retries such a refusal itself (server/runtime/storage_retry.py), so the
    handler would not see it, and the count shows the faults did reach appends."""

    calls: int = 0
    unavailable: int = 0

    @classmethod
    def install(cls, app: LeaseholdApp) -> AppendProbe:
        probe = cls()
        repository = app.repository
        assert repository is not None
        original = repository.append_event

        async def append_event(
            lease: Lease, event_type: str, payload: dict[str, Any], request_id: str | None = None
        ) -> JobEvent:
            probe.calls += 1
            try:
                return await original(lease, event_type, payload, request_id)
            except StorageUnavailable:
                probe.unavailable += 1
                raise

        repository.append_event = append_event  # type: ignore[method-assign]
        return probe


# ----- through the service ---------------------------------------------------------------


async def run_fanout_jobs(stub: Stub, handlers: StreamHandlers) -> tuple[list[str], list[Watcher]]:
    """Enqueue the jobs, subscribe a watcher to each, and let the appenders go once
    every watcher is following the running job live."""
    payload = {"appenders": APPENDERS, "per_appender": PER_APPENDER, "wait_go": True}
    job_ids = [await enqueue_retrying(stub, payload) for _ in range(JOBS)]
    watchers = [grpc_watcher(stub, job_id) for job_id in job_ids]
    async with asyncio.timeout(WATCH_SECONDS):
        await asyncio.gather(*(watcher.started.wait() for watcher in watchers))
    for job_id in job_ids:
        handlers.release(job_id)
    await finish(watchers)
    return job_ids, watchers


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_concurrent_appenders_give_each_job_one_gap_free_log(
    app: LeaseholdApp, stub: Stub, handlers: StreamHandlers, figures: Figures
) -> None:
    job_ids, watchers = await run_fanout_jobs(stub, handlers)

    lengths = []
    for job_id, watcher in zip(job_ids, watchers, strict=True):
        log = stored_log(app.settings.database_url, job_id)
        lengths.append(check_log(log, [watcher.received], handlers.acks[job_id], exact_lifecycle=True))
    assert lengths == [len(LIFECYCLE_WITHOUT_FAULTS) + APPENDERS * PER_APPENDER] * JOBS
    assert handlers.retried_appends == 0
    report(figures, lengths, [ack for job_id in job_ids for ack in handlers.acks[job_id]])


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_appends_retried_after_commit_faults_land_exactly_once(
    app: LeaseholdApp, stub: Stub, handlers: StreamHandlers, figures: Figures
) -> None:
    """A failed COMMIT leaves no event and no used-up sequence behind, so an append
    retried after it lands once. (When the faults also hit the attempt's final
    write, the job runs again after its lease expires; the handler skips the events
    it had been told were written, so each logical event is still in the log once.)"""
    probe = AppendProbe.install(app)
    # Only commits that carry events may fail: most of them are the appends'.
    with commit_faults(rate=FAULT_RATE, seed=FAULT_SEED, only_after="INSERT INTO job_events") as faults:
        job_ids, watchers = await run_fanout_jobs(stub, handlers)

    assert faults.injected > 0, "no fault was injected: the variant proved nothing"
    assert probe.unavailable > 0, "no append met a fault"
    lengths = []
    for job_id, watcher in zip(job_ids, watchers, strict=True):
        log = stored_log(app.settings.database_url, job_id)
        lengths.append(check_log(log, [watcher.received], handlers.acks[job_id], exact_lifecycle=False))
    report(figures, lengths, [ack for job_id in job_ids for ack in handlers.acks[job_id]])
    figures("commits", faults.commits)
    figures("commit faults injected", faults.injected)
    figures("appends failed and retried", probe.unavailable)
    figures("appends retried by the handler", handlers.retried_appends)
    figures("job attempts", sum(handlers.attempts[job_id] for job_id in job_ids))


# ----- two repositories on one database, one lease -----------------------------------------

# Two writers on one SQLite file take turns at its write lock, so this variant is
# slower per event; two jobs keep it within the budget. (On PostgreSQL they write
# at once, taking turns only at each job's row lock.)
SHARED_LEASE_JOBS = 2
# A refusal that came after at least this long was SQLite's busy timeout (5 s)
# running out, not an injected fault (those fail at once).
BUSY_TIMEOUT_WAIT_SECONDS = 4.0


@contextlib.contextmanager
def maybe_faults(rate: float) -> Iterator[CommitFaults | None]:
    if rate == 0:
        yield None
        return
    with commit_faults(rate=rate, seed=FAULT_SEED) as faults:
        yield faults


@dataclass
class Refusals:
    """StorageUnavailable answers the appenders met (and retried), with how long
    each refused try had waited."""

    waits: list[float]

    @property
    def after_busy_timeout(self) -> int:
        return sum(wait >= BUSY_TIMEOUT_WAIT_SECONDS for wait in self.waits)


async def append_as(
    repository: SqlJobRepository, lease: Lease, payload: dict[str, Any], refusals: Refusals
) -> JobEvent:
    """One append, retried after StorageUnavailable the way the runtime's job
    context retries it (server/runtime/storage_retry.py)."""
    for _ in range(MAX_TRIES - 1):
        began = time.monotonic()
        try:
            return await repository.append_event(lease, FAN_EVENT, payload)
        except StorageUnavailable:
            refusals.waits.append(time.monotonic() - began)
            await asyncio.sleep(0.005)
    return await repository.append_event(lease, FAN_EVENT, payload)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault_rate", [0.0, FAULT_RATE])
async def test_appenders_on_two_repositories_sharing_a_lease_give_one_log(
    database_url: str, fault_rate: float, figures: Figures
) -> None:
    """Two repositories over one database are two writers with their own
    connections, exactly as two processes would be; the lease is the only thing
    they share. Half of each job's appenders write through each. One watcher
    follows through the first (woken in-process by its own commits, and by the
    other's as the engine reports them), another through a third repository that
    writes nothing and learns of every event that way: SQLite's change counter,
    polled every 50 ms, or PostgreSQL's notifications (which ignore the poll
    interval: they arrive as the other writer commits).

    On PostgreSQL the two writers' batches can also lock the same jobs' rows in
    opposite orders; the losing batch is rolled back and run again, which must
    neither lose nor duplicate an append."""
    url = database_url
    await asyncio.to_thread(migrate.upgrade, url)
    first, second, reader = (
        SqlJobRepository(create_engines(url), SystemClock(), other_writers_poll_seconds=0.05)
        for _ in range(3)
    )
    acks: dict[str, list[Ack]] = {}
    refusals = Refusals([])
    try:
        with maybe_faults(fault_rate) as faults:
            job_ids = [
                (await retrying(lambda: first.enqueue(NewJob(OWNER, FANOUT, {}))))[0].id
                for _ in range(SHARED_LEASE_JOBS)
            ]
            leases: dict[str, Lease] = {}
            while len(leases) < SHARED_LEASE_JOBS:
                result = await retrying(lambda: first.claim("worker-a", SHARED_LEASE_JOBS - len(leases), 60))
                leases.update({claimed.job.id: claimed.lease for claimed in result.jobs})
            assert sorted(leases) == sorted(job_ids)
            watchers = {
                job_id: [repository_watcher(first, job_id), repository_watcher(reader, job_id)]
                for job_id in job_ids
            }
            async with asyncio.timeout(WATCH_SECONDS):
                await asyncio.gather(*(w.started.wait() for ws in watchers.values() for w in ws))

            async def appender(job_id: str, number: int) -> None:
                repository = first if number % 2 == 0 else second
                for index in range(PER_APPENDER):
                    event_id = f"{number}:{index}"
                    payload = {"id": event_id, "appender": number, "index": index}
                    issued = time.monotonic()
                    event = await append_as(repository, leases[job_id], payload, refusals)
                    acks.setdefault(job_id, []).append(
                        Ack(job_id, 1, number, index, event_id, event.sequence, issued, time.monotonic())
                    )

            async with asyncio.TaskGroup() as group:
                for job_id in job_ids:
                    for number in range(APPENDERS):
                        group.create_task(appender(job_id, number))
            for job_id in job_ids:
                await retrying(lambda job_id=job_id: second.succeed(leases[job_id]))
            await finish([w for ws in watchers.values() for w in ws])
    finally:
        for repository in (first, second, reader):
            await repository.close()

    lengths = []
    for job_id in job_ids:
        log = stored_log(url, job_id)
        copies = [watcher.received for watcher in watchers[job_id]]
        lengths.append(check_log(log, copies, acks[job_id], exact_lifecycle=True))
    if faults is not None:
        assert faults.injected > 0, "no fault was injected: the variant proved nothing"
        assert len(refusals.waits) > 0, "no append met a fault"
        figures("commit faults injected", faults.injected)
    report(figures, lengths, [ack for job_id in job_ids for ack in acks[job_id]])
    figures("appends refused and retried", len(refusals.waits))
    # Without injected faults, a refusal on SQLite can only be the other writer
    # holding the write lock past the 5 s busy timeout (see the report).
    # PostgreSQL has no busy timeout: a refusal there is a batch that lost a lock
    # conflict to the other writer five times running, answered at once.
    figures("refusals after the busy timeout", refusals.after_busy_timeout)

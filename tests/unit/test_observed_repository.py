"""`ObservedRepository` around a real engine (the in-memory one) with faults
injected beneath it: what it counts when storage fails or a lease is lost, and
that it answers exactly what the engine answers."""

from __future__ import annotations

import inspect

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import LeaseLost, StorageClosed, StorageFull, StorageUnavailable
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import Job, JobStatus, NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.metrics.instruments import Metrics
from leasehold._server.metrics.kind_labels import KindLabels
from leasehold._server.metrics.observed import ObservedRepository
from leasehold._server.runtime.context import JobContext
from leasehold._server.runtime.executor import AttemptExecutor
from leasehold._server.runtime.registry import HandlerRegistry
from tests.support import OWNER


class Failing:
    """The real repository, except that `get` raises `error`."""

    def __init__(self, inner: JobRepository, error: Exception) -> None:
        self._inner = inner
        self._error = error

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def get(self, owner_id: str, job_id: str) -> Job:
        raise self._error


class Recording:
    """The real repository, noting the name of each member asked of it."""

    def __init__(self, inner: JobRepository) -> None:
        self._inner = inner
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> object:
        self.asked.append(name)
        return getattr(self._inner, name)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("error", "counted"),
    [
        (StorageUnavailable("database is locked"), 1),
        (StorageFull("disk full"), 1),
        (StorageClosed("the repository is closed"), 0),  # this process is stopping
        (LeaseLost("j1"), 0),  # not storage's fault (and not a worker write here either)
    ],
    ids=["unavailable", "full", "closed", "other"],
)
async def test_a_storage_failure_is_counted_and_still_raised(error: Exception, counted: int) -> None:
    metrics = Metrics()
    clock = ManualClock()
    observed = ObservedRepository(Failing(MemoryJobRepository(clock), error), metrics, clock)  # type: ignore[arg-type]

    with pytest.raises(type(error)):
        await observed.get(OWNER, "j1")

    assert value(metrics, "leasehold_storage_errors_total") == counted


async def test_answers_are_the_engines_and_lost_leases_are_counted_once_each() -> None:
    metrics = Metrics(KindLabels(chosen=KindPatterns.parse(["k.one"])))
    clock = ManualClock()
    observed = ObservedRepository(MemoryJobRepository(clock), metrics, clock)
    job, created = await observed.enqueue(NewJob(owner_id=OWNER, kind="k.one", payload={"p": 1}))
    assert created and (await observed.get(OWNER, job.id)).id == job.id
    claimed = (await observed.claim("w1", 1, 10)).jobs[0]
    clock.advance(11)
    assert [r.job_id for r in await observed.recover_expired_leases()] == [job.id]

    assert await observed.heartbeat([claimed.lease], 10) == [None]
    with pytest.raises(LeaseLost):
        await observed.succeed(claimed.lease)

    assert value(metrics, "leasehold_stale_writes_rejected_total") == 2
    assert value(metrics, "leasehold_lease_expired_total", kind="k.one") == 1
    assert value(metrics, "leasehold_jobs_enqueued_total", kind="k.one") == 1
    assert value(metrics, "leasehold_jobs_finished_total", kind="k.one", status="succeeded") == 0


def test_every_member_of_the_protocol_is_there_and_nothing_else() -> None:
    """A member added to `JobRepository` must reach the engine through the
    metrics layer too, without anyone remembering to forward it."""
    clock = ManualClock()
    observed = ObservedRepository(MemoryJobRepository(clock), Metrics(), clock)
    members = [name for name in dir(JobRepository) if not name.startswith("_")]
    assert "succeed_status" in members

    for name in members:
        declared = getattr(JobRepository, name)
        if isinstance(declared, property):
            assert getattr(observed, name) is getattr(observed._inner, name), name
        else:
            assert inspect.iscoroutinefunction(getattr(observed, name)), name
    with pytest.raises(AttributeError):
        observed.no_such_member  # noqa: B018 (only the protocol is forwarded)


async def test_with_metrics_on_the_executor_finishes_a_success_through_succeed_status() -> None:
    """The narrow write the SQL engine makes cheap is the one the runtime uses
    when it writes through the metrics layer, and the success is still counted
    (kind, status and run time) from what the claim saw."""
    metrics = Metrics(KindLabels(chosen=KindPatterns.parse(["k.one"])))
    clock = ManualClock()
    engine = Recording(MemoryJobRepository(clock))
    observed = ObservedRepository(engine, metrics, clock)  # type: ignore[arg-type]
    registry = HandlerRegistry()

    async def handler(ctx: JobContext) -> None:
        clock.advance(3)

    registry.register("k.one", handler)
    job, _ = await observed.enqueue(NewJob(owner_id=OWNER, kind="k.one", payload={}))
    (claimed,) = (await observed.claim("w1", 1, 30)).jobs
    engine.asked.clear()

    await AttemptExecutor(observed, registry, 30).execute(claimed)

    assert "succeed_status" in engine.asked and "succeed" not in engine.asked
    assert (await observed.get(OWNER, job.id)).status is JobStatus.SUCCEEDED
    assert value(metrics, "leasehold_jobs_finished_total", kind="k.one", status="succeeded") == 1
    assert value(metrics, "leasehold_job_run_seconds_count") == 1
    assert value(metrics, "leasehold_job_run_seconds_sum") == 3

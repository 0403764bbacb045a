"""`ObservedRepository` around a real engine (the in-memory one) with faults
injected beneath it: what it counts when storage fails or a lease is lost, and
that it answers exactly what the engine answers."""

from __future__ import annotations

import inspect

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import LeaseLost, StorageClosed, StorageFull, StorageUnavailable
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import Job, NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.metrics.instruments import Metrics
from leasehold._server.metrics.kind_labels import KindLabels
from leasehold._server.metrics.observed import ObservedRepository
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

    for name in members:
        declared = getattr(JobRepository, name)
        if isinstance(declared, property):
            assert getattr(observed, name) is getattr(observed._inner, name), name
        else:
            assert inspect.iscoroutinefunction(getattr(observed, name)), name
    with pytest.raises(AttributeError):
        observed.no_such_member  # noqa: B018 (only the protocol is forwarded)

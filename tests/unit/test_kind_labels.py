"""A kind is a metrics label of its own only when the operator chose it (a
local handler's kind, a remote kind named exactly, a `--metrics-kinds`
match); every other kind is counted as `other`, by the counters and the queue
gauges alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import NewJob, QueuedKind
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.metrics.instruments import Metrics
from leasehold._server.metrics.kind_labels import OTHER_KIND, KindLabels
from leasehold._server.metrics.observed import ObservedRepository
from leasehold._server.metrics.queue import fold
from leasehold._server.runtime.registry import HandlerRegistry
from tests.support import OWNER

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _noop(ctx: object) -> None:
    return None


def _registry(*kinds: str) -> HandlerRegistry:
    registry = HandlerRegistry()
    for kind in kinds:
        registry.register(kind, _noop)  # type: ignore[arg-type]
    return registry


def _labels(
    local: tuple[str, ...] = (), remote: tuple[str, ...] = (), metrics: tuple[str, ...] = ()
) -> KindLabels:
    return KindLabels.of(_registry(*local), KindPatterns.parse(remote), KindPatterns.parse(metrics))


def test_local_kinds_and_exact_remote_kinds_keep_their_names() -> None:
    labels = _labels(local=("email.send",), remote=("media.transcode", "remote.*"))

    assert labels("email.send") == "email.send"
    assert labels("media.transcode") == "media.transcode"


def test_a_kind_only_a_remote_prefix_matches_is_other() -> None:
    labels = _labels(local=("email.send",), remote=("remote.*",))

    assert labels("remote.invented-1") == OTHER_KIND
    assert labels("remote.invented-2") == OTHER_KIND
    assert labels("never.heard.of") == OTHER_KIND


def test_metrics_kinds_patterns_choose_kinds_exactly_or_by_prefix() -> None:
    labels = _labels(remote=("remote.*",), metrics=("remote.billing.*", "remote.report"))

    assert labels("remote.billing.invoice") == "remote.billing.invoice"
    assert labels("remote.report") == "remote.report"
    assert labels("remote.reports") == OTHER_KIND
    assert labels("remote.other-thing") == OTHER_KIND


def test_a_handler_registered_after_start_gets_its_own_label() -> None:
    registry = _registry()
    labels = KindLabels.of(registry, KindPatterns(), KindPatterns())
    assert labels("late.kind") == OTHER_KIND

    registry.register("late.kind", _noop)  # type: ignore[arg-type]

    assert labels("late.kind") == "late.kind"


def test_no_labels_given_counts_every_kind_as_other() -> None:
    assert KindLabels()("email.send") == OTHER_KIND


def test_the_queue_gauges_sum_the_folded_depths_and_keep_the_oldest_due_time() -> None:
    labels = _labels(local=("email.send",), remote=("remote.*",))
    queued = [
        QueuedKind("email.send", 2, T0),
        QueuedKind("remote.a", 3, T0 + timedelta(seconds=5)),
        QueuedKind("remote.b", 4, T0 - timedelta(seconds=7)),
    ]

    assert fold(queued, labels) == {
        "email.send": (2, T0),
        OTHER_KIND: (7, T0 - timedelta(seconds=7)),
    }


async def test_thousands_of_invented_kinds_make_one_series_per_counter() -> None:
    clock = ManualClock()
    metrics = Metrics(_labels(local=("email.send",), remote=("remote.*",)))
    observed = ObservedRepository(MemoryJobRepository(clock), metrics, clock)
    await observed.enqueue_batch(
        [NewJob(owner_id=OWNER, kind=f"remote.k{n}", payload={}) for n in range(2000)]
        + [NewJob(owner_id=OWNER, kind="email.send", payload={})]
    )

    enqueued = {
        sample.labels["kind"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "leasehold_jobs_enqueued"
        for sample in family.samples
        if sample.name == "leasehold_jobs_enqueued_total"
    }
    assert enqueued == {OTHER_KIND: 2000, "email.send": 1}

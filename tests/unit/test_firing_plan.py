"""`plan_firing`, the one rule every engine fires by (DESIGN §12)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from leasehold._server.jobs.schedules import (
    MAX_COUNTED_FIRINGS,
    ON_TIME_SECONDS,
    JobTemplate,
    OverlapPolicy,
    Schedule,
    SkipReason,
    plan_firing,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def due(cron: str = "0 * * * *", window: int = 0, overlap: OverlapPolicy = OverlapPolicy.SKIP) -> Schedule:
    return Schedule(
        owner_id="alice",
        schedule_id="s",
        cron=cron,
        time_zone="UTC",
        template=JobTemplate(kind="example.echo", payload={}),
        overlap=overlap,
        catchup_window_seconds=window,
        paused=False,
        next_fire_at=T0 + timedelta(hours=1),
        created_at=T0,
        updated_at=T0,
    )


def test_an_on_time_firing_is_enqueued() -> None:
    firing = plan_firing(due(), T0 + timedelta(hours=1, seconds=1), previous_running=False)
    assert (firing.fire_at, firing.skipped, firing.last_skip_reason) == (T0 + timedelta(hours=1), 0, None)
    assert firing.next_fire_at == T0 + timedelta(hours=2)


def test_the_on_time_allowance_ends_at_its_limit() -> None:
    at_limit = T0 + timedelta(hours=1, seconds=ON_TIME_SECONDS)
    assert plan_firing(due(), at_limit, False).fire_at == T0 + timedelta(hours=1)
    late = plan_firing(due(), at_limit + timedelta(microseconds=1), False)
    assert (late.fire_at, late.skipped, late.last_skip_reason) == (None, 1, SkipReason.CATCHUP_WINDOW)


def test_only_the_latest_missed_firing_within_the_window_is_enqueued() -> None:
    now = T0 + timedelta(hours=5, minutes=20)
    firing = plan_firing(due(window=1800), now, False)
    assert firing.fire_at == T0 + timedelta(hours=5)
    assert (firing.skipped, firing.last_skipped_fire_at) == (4, T0 + timedelta(hours=4))
    assert firing.next_fire_at == T0 + timedelta(hours=6)


def test_overlap_skip_passes_over_the_firing_and_allow_does_not() -> None:
    now = T0 + timedelta(hours=1, seconds=1)
    skipped = plan_firing(due(overlap=OverlapPolicy.SKIP), now, previous_running=True)
    assert (skipped.fire_at, skipped.skipped, skipped.last_skip_reason) == (None, 1, SkipReason.OVERLAP)
    assert skipped.last_skipped_fire_at == T0 + timedelta(hours=1)
    allowed = plan_firing(due(overlap=OverlapPolicy.ALLOW), now, previous_running=True)
    assert allowed.fire_at == T0 + timedelta(hours=1) and allowed.skipped == 0


def test_a_long_outage_counts_at_most_the_cap_and_still_finds_the_latest() -> None:
    now = T0 + timedelta(days=2, seconds=5)
    firing = plan_firing(due(cron="* * * * *"), now, False)
    assert firing.fire_at == T0 + timedelta(days=2)
    assert firing.skipped == MAX_COUNTED_FIRINGS - 1
    assert firing.next_fire_at == T0 + timedelta(days=2, minutes=1)

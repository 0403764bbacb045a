"""GetQueueStats stays bounded however many kinds and owners there are: at
most STATS_KIND_LIMIT kinds (the paused, then the busiest, still ordered by
kind) and STATS_OWNER_LIMIT owners (most running first), with `truncated`
saying that some were left out."""

from __future__ import annotations

from datetime import UTC, datetime

from leasehold._server.api.admin_servicer import stats_to_proto
from leasehold._server.jobs import admin
from leasehold._server.jobs.records import JobStatus

NOW = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
LONGEST_KIND = "k" * 128
LONGEST_OWNER = "o" * 128


def _stats(
    live: list[tuple[str, JobStatus, int]],
    owners: list[tuple[str, int]] | None = None,
    paused: set[str] | None = None,
) -> admin.QueueStats:
    return admin.assemble_stats(
        NOW,
        live=live,
        running_by_owner=owners or [],
        oldest_due_by_kind={},
        finished=[],
        oldest=None,
        paused=paused or set(),
    )


def test_few_kinds_and_owners_are_all_listed_and_not_truncated() -> None:
    stats = _stats([("b.work", JobStatus.QUEUED, 2), ("a.work", JobStatus.RUNNING, 1)], [("alice", 1)])

    assert [kind.kind for kind in stats.kinds] == ["a.work", "b.work"]
    assert stats.running_by_owner == [("alice", 1)]
    assert not stats.truncated


def test_past_the_limit_the_paused_and_busiest_kinds_are_kept_in_kind_order() -> None:
    limit = admin.STATS_KIND_LIMIT
    live = [(f"idle.{n:05d}", JobStatus.QUEUED, 1) for n in range(limit + 500)]
    live += [("zz.busy", JobStatus.QUEUED, 50), ("aa.busy", JobStatus.RUNNING, 40)]

    stats = _stats(live, paused={"zz.paused-and-empty"})

    names = [kind.kind for kind in stats.kinds]
    assert len(names) == limit and stats.truncated
    assert names == sorted(names)
    assert {"zz.busy", "aa.busy", "zz.paused-and-empty"} <= set(names)


def test_past_the_limit_the_owners_with_most_running_are_kept() -> None:
    limit = admin.STATS_OWNER_LIMIT
    owners = [(f"owner-{n}", 1) for n in range(limit + 10)] + [("zz-busy", 9)]

    stats = _stats([], owners)

    assert len(stats.running_by_owner) == limit and stats.truncated
    assert stats.running_by_owner[0] == ("zz-busy", 9)


def test_the_largest_answer_stays_far_below_a_grpc_clients_4_mib() -> None:
    live = [(f"{LONGEST_KIND[:-6]}{n:06d}", status, 2**40) for n in range(5000) for status in JobStatus]
    owners = [(f"{LONGEST_OWNER[:-6]}{n:06d}", 2**40) for n in range(5000)]

    response = stats_to_proto(_stats(live, owners))

    assert response.truncated
    assert response.ByteSize() < 1024 * 1024

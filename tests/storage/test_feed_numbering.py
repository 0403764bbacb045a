"""Numbering events in the owners' feeds costs the common writes no lookup:
an enqueue, a claim, an append and a success hand `feed.seal` the owner, kind
and resource of the rows they wrote (their statements return them), so only a
write that did not have its job's row in hand (a released child) looks one up."""

from __future__ import annotations

from typing import Any

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql.rows import SqlRows
from tests.contract.helpers import LEASE
from tests.support import OWNER, make_repository


async def test_the_common_writes_number_their_events_without_a_lookup(
    database_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []
    original = SqlRows.feed_subjects

    def counted(self: SqlRows, job_ids: Any) -> Any:
        looked_up.extend(job_ids)
        return original(self, job_ids)

    monkeypatch.setattr(SqlRows, "feed_subjects", counted)
    repository = await make_repository(database_url, clock)
    try:
        await repository.enqueue(
            NewJob(owner_id=OWNER, kind="media.resize", payload={}, resource_type="photo", resource_id="p1")
        )
        (claimed,) = (await repository.claim("w1", 1, LEASE)).jobs
        await repository.append_event(claimed.lease, "progress", {"step": 1})
        await repository.succeed_status(claimed.lease)
        await repository.enqueue_batch(
            [NewJob(owner_id=OWNER, kind="media.resize", payload={}) for _ in range(3)]
        )

        page = await repository.read_feed(OWNER, 0, 100)
    finally:
        await repository.close()

    assert looked_up == []
    assert [n.event.type for n in page.events] == [
        "job.queued",
        "job.started",
        "progress",
        "job.succeeded",
        "job.queued",
        "job.queued",
        "job.queued",
    ]
    assert [(n.subject.kind, n.subject.resource_type) for n in page.events[:4]] == [
        ("media.resize", "photo")
    ] * 4

"""Two replicas on one database fire every firing exactly once (DESIGN §12).

Both replicas ask at every simulated minute, at the same moment (their
`fire_due_schedules` calls run concurrently), over 200 minutes and several
schedules of different rhythms; some minutes only one of them asks, as when a
replica is slow or down. Every firing must show up as exactly one job.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.cron import CronRule
from leasehold._server.jobs.records import JobFilter
from leasehold._server.jobs.schedules import (
    SCHEDULE_RESOURCE_TYPE,
    JobTemplate,
    NewSchedule,
    OverlapPolicy,
    rfc3339,
)
from tests.support import ENGINES, OWNER, fresh_database_url, make_repository

MINUTES = 200
RULES = {
    "every-minute": "* * * * *",
    "every-3": "*/3 * * * *",
    "odd-minutes": "1-59/2 * * * *",
    "at-17": "17 * * * *",
}


@pytest.mark.parametrize("engine", ENGINES)
async def test_two_replicas_fire_each_firing_once_over_200_minutes(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    clock = ManualClock()
    start = clock.now()
    url = fresh_database_url(engine, request, tmp_path)
    first, second = await make_repository(url, clock), await make_repository(url, clock)
    try:
        for schedule_id, cron in RULES.items():
            await first.create_schedule(
                NewSchedule(
                    owner_id=OWNER,
                    schedule_id=schedule_id,
                    rule=CronRule.parse(cron, "UTC"),
                    template=JobTemplate(kind="example.echo", payload={}),
                    overlap=OverlapPolicy.ALLOW,
                )
            )
        for minute in range(1, MINUTES + 1):
            clock.advance(60)
            if minute % 10 == 0:
                await second.fire_due_schedules()  # the first replica is slow this minute
            else:
                await asyncio.gather(first.fire_due_schedules(), second.fire_due_schedules())
        jobs = []
        cursor = None
        while True:
            page = await first.list_jobs(OWNER, JobFilter(resource_type=SCHEDULE_RESOURCE_TYPE), 500, cursor)
            jobs.extend(page.jobs)
            if (cursor := page.next_cursor) is None:
                break
        counts = Counter(job.resource_id for job in jobs)
        expected = {
            f"{schedule_id}@{rfc3339(moment)}"
            for schedule_id, cron in RULES.items()
            for moment in CronRule.parse(cron, "UTC").firings(start, start + timedelta(minutes=MINUTES))
        }
        assert set(counts) == expected
        assert max(counts.values()) == 1
        assert len(jobs) == len(expected) == 200 + 67 + 100 + 3
        for schedule_id in RULES:
            assert (await second.get_schedule(OWNER, schedule_id)).skipped_firings == 0
    finally:
        await first.close()
        await second.close()

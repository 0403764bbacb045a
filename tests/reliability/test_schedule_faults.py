"""Firings under injected commit faults (DESIGN §12, with experiment 8's faults):
half of the COMMITs of the transactions that fire schedules fail as the engine
would report them. The timer's next look (here, at once) tries again; every
firing still lands as exactly one job, and none is lost."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.cron import CronRule
from leasehold._server.jobs.errors import StorageUnavailable
from leasehold._server.jobs.records import JobFilter
from leasehold._server.jobs.schedules import SCHEDULE_RESOURCE_TYPE, rfc3339
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.contract.test_schedules import schedule
from tests.reliability.conftest import Figures
from tests.reliability.faults import commit_faults
from tests.support import ENGINES, OWNER, fresh_database_url, make_repository

MINUTES = 120


async def fire_until_it_commits(repository: SqlJobRepository) -> int:
    """What the timer does across its rounds: look again until a look commits.
    Returns how many looks failed."""
    failed = 0
    while True:
        try:
            await repository.fire_due_schedules()
            return failed
        except StorageUnavailable:
            failed += 1


@pytest.mark.parametrize("engine", ENGINES)
async def test_firings_under_commit_faults_land_exactly_once(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, figures: Figures
) -> None:
    clock = ManualClock()
    start = clock.now()
    repository = await make_repository(fresh_database_url(engine, request, tmp_path), clock)
    try:
        await repository.create_schedule(schedule(schedule_id="every-minute", cron="* * * * *"))
        await repository.create_schedule(schedule(schedule_id="every-7", cron="*/7 * * * *"))
        failed_looks = 0
        with commit_faults(0.5, seed=15, only_after="UPDATE schedules") as faults:
            for _ in range(MINUTES):
                clock.advance(60)
                failed_looks += await fire_until_it_commits(repository)
        assert faults.injected == failed_looks > 10
        figures("failed commits of firings", faults.injected)
        figures("injected, by kind", dict(faults.kinds))
        page = await repository.list_jobs(OWNER, JobFilter(resource_type=SCHEDULE_RESOURCE_TYPE), 500, None)
        counts = Counter(job.resource_id for job in page.jobs)
        end = start + timedelta(minutes=MINUTES)
        expected = {
            f"{name}@{rfc3339(moment)}"
            for name, cron in (("every-minute", "* * * * *"), ("every-7", "*/7 * * * *"))
            for moment in CronRule.parse(cron, "UTC").firings(start, end)
        }
        assert set(counts) == expected and max(counts.values()) == 1
        for name in ("every-minute", "every-7"):
            assert (await repository.get_schedule(OWNER, name)).skipped_firings == 0
    finally:
        await repository.close()

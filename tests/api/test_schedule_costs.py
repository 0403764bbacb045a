"""A schedule's cron rule is the caller's to write, and evaluating it costs the
server CPU: a rule whose every match a clock change skips used to walk the
calendar to year 9999 on the event loop (most of a second each), so twenty of
them at once stalled every other owner's calls for many seconds, long enough
to outlast leases. The steps a search may take are bounded (tests/unit/
test_cron.py counts them) and the evaluation runs off the event loop; here,
over a real server, another owner's calls are answered while such requests
arrive, and an oversized time zone is refused without being echoed back."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from leasehold.v1 import jobs_pb2, schedules_pb2_grpc
from tests.api.helpers import expect_error
from tests.api.test_schedules import create
from tests.support import OTHER_OWNER, OWNER, owner_metadata

GAP_ONLY = {"cron": "30 2 * 3 0#2", "time_zone": "America/New_York"}
# A latency promise, so a bound on time; generous enough to hold on a loaded
# machine. The stall this guards against lasted well over ten seconds.
ANSWERED_WITHIN = 3.0


@pytest.fixture
def schedules(channel: grpc.aio.Channel) -> schedules_pb2_grpc.ScheduleServiceStub:
    return schedules_pb2_grpc.ScheduleServiceStub(channel)


async def test_twenty_gap_only_rules_at_once_leave_another_owner_answered(schedules, stub, app) -> None:
    listing = jobs_pb2.ListRequest(page_size=10)
    await stub.List(listing, metadata=owner_metadata(OTHER_OWNER))  # warm: connection, first query

    refusals = [
        asyncio.ensure_future(
            expect_error(
                create(schedules, OWNER, schedule_id=f"gap-{index}", **GAP_ONLY),
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        )
        for index in range(20)
    ]
    began = time.monotonic()
    await stub.List(listing, metadata=owner_metadata(OTHER_OWNER))
    took = time.monotonic() - began
    errors = await asyncio.gather(*refusals)

    assert all("never fires in America/New_York" in err.details() for err in errors)
    assert took < ANSWERED_WITHIN, took


async def test_a_megabyte_time_zone_is_refused_without_being_echoed(schedules, app) -> None:
    err = await expect_error(create(schedules, time_zone="Z" * 1_000_000), grpc.StatusCode.INVALID_ARGUMENT)
    assert err.details() == "time_zone: must be at most 64 characters"
    assert sum(len(value) for _, value in err.trailing_metadata() or ()) < 1_000

"""ScheduleService over a real port, on each engine (DESIGN §12): every RPC,
owner isolation byte for byte, and bad input naming its field.

Firing itself is covered on the manual clock (tests/contract/test_schedules.py);
here the server's own timer fires a schedule once, to show it is wired.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import ManualClock
from leasehold._server.config import Settings
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, schedules_pb2, schedules_pb2_grpc
from tests.api.helpers import error_reason, expect_error, expect_invalid, field_violations, get_job, struct
from tests.support import OTHER_OWNER, OWNER, owner_metadata, test_registry

THIRD_OWNER = "carol"
RPCS = ["GetSchedule", "PauseSchedule", "ResumeSchedule", "DeleteSchedule", "TriggerSchedule"]


@pytest.fixture
def schedules(channel: grpc.aio.Channel) -> schedules_pb2_grpc.ScheduleServiceStub:
    return schedules_pb2_grpc.ScheduleServiceStub(channel)


def create_request(**fields: Any) -> schedules_pb2.CreateScheduleRequest:
    job = fields.pop("job", None) or schedules_pb2.ScheduleJob(kind="example.echo", payload=struct({"n": 1}))
    defaults: dict[str, Any] = {"schedule_id": "nightly", "cron": "0 3 * * *", "job": job}
    defaults.update(fields)
    return schedules_pb2.CreateScheduleRequest(**defaults)


async def create(stub: schedules_pb2_grpc.ScheduleServiceStub, owner: str = OWNER, **fields: Any) -> Any:
    response = await stub.CreateSchedule(create_request(**fields), metadata=owner_metadata(owner))
    return response.schedule


def call(stub: schedules_pb2_grpc.ScheduleServiceStub, rpc: str, schedule_id: str, owner: str) -> Any:
    request_type = getattr(schedules_pb2, f"{rpc}Request")
    return getattr(stub, rpc)(request_type(schedule_id=schedule_id), metadata=owner_metadata(owner))


async def test_every_rpc_round_trips(
    schedules, stub: jobs_pb2_grpc.JobServiceStub, app: LeaseholdApp
) -> None:
    created = await create(
        schedules,
        cron="0 9 * * mon-fri",
        time_zone="America/New_York",
        overlap=schedules_pb2.OVERLAP_POLICY_ALLOW,
        catchup_window_seconds=600,
        job=schedules_pb2.ScheduleJob(
            kind="example.echo",
            payload=struct({"report": "daily"}),
            max_attempts=5,
            priority=1,
            retry_policy=jobs_pb2.RetryPolicy(initial_interval_seconds=2),
        ),
    )
    assert (created.schedule_id, created.cron, created.time_zone) == (
        "nightly",
        "0 9 * * mon-fri",
        "America/New_York",
    )
    assert created.overlap == schedules_pb2.OVERLAP_POLICY_ALLOW and created.catchup_window_seconds == 600
    assert created.job.max_attempts == 5 and created.job.priority == 1 and created.job.timeout_seconds == 900
    assert created.job.retry_policy.initial_interval_seconds == 2
    assert created.HasField("next_fire_at") and not created.HasField("last_fire_at")
    got = (
        await schedules.GetSchedule(
            schedules_pb2.GetScheduleRequest(schedule_id="nightly"), metadata=owner_metadata(OWNER)
        )
    ).schedule
    assert got == created

    paused = (await call(schedules, "PauseSchedule", "nightly", OWNER)).schedule
    assert paused.paused and not paused.HasField("next_fire_at")
    resumed = (await call(schedules, "ResumeSchedule", "nightly", OWNER)).schedule
    assert not resumed.paused and resumed.next_fire_at == created.next_fire_at

    triggered = await call(schedules, "TriggerSchedule", "nightly", OWNER)
    assert triggered.job.resource_type == "leasehold.schedule"
    assert triggered.job.resource_id.startswith("nightly@") and triggered.job.resource_id.endswith("Z")
    assert triggered.schedule.last_job_id == triggered.job.id
    assert triggered.job.priority == 1 and triggered.job.max_attempts == 5

    await create(schedules, schedule_id="another")
    listed = await schedules.ListSchedules(
        schedules_pb2.ListSchedulesRequest(page_size=1), metadata=owner_metadata(OWNER)
    )
    assert [s.schedule_id for s in listed.schedules] == ["another"] and listed.next_page_token
    rest = await schedules.ListSchedules(
        schedules_pb2.ListSchedulesRequest(page_size=1, page_token=listed.next_page_token),
        metadata=owner_metadata(OWNER),
    )
    assert [s.schedule_id for s in rest.schedules] == ["nightly"] and not rest.next_page_token

    await call(schedules, "DeleteSchedule", "nightly", OWNER)
    await expect_error(call(schedules, "GetSchedule", "nightly", OWNER), grpc.StatusCode.PERMISSION_DENIED)
    # Its job stays.
    assert (await get_job(stub, triggered.job.id)).id == triggered.job.id


async def test_the_servers_own_timer_fires_a_due_schedule(database_url: str, tmp_path) -> None:
    """A server on a manual clock: moving the clock past a fire time and waking
    the timer (as its own timeout would) enqueues the firing's job."""
    clock = ManualClock(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC))
    settings = Settings(
        database_url=database_url, listen="127.0.0.1:0", runtime=RuntimeSettings(poll_seconds=0.05)
    )
    app = LeaseholdApp(settings, clock=clock, registry=test_registry())
    port = await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = schedules_pb2_grpc.ScheduleServiceStub(channel)
            created = await create(stub, cron="* * * * *", overlap=schedules_pb2.OVERLAP_POLICY_ALLOW)
            assert created.next_fire_at.ToDatetime(tzinfo=UTC) == datetime(2026, 6, 1, 12, 1, tzinfo=UTC)
            clock.advance(31)
            assert app.schedule_timer is not None
            app.schedule_timer.wake()
            for _ in range(200):
                got = (await call(stub, "GetSchedule", "nightly", OWNER)).schedule
                if got.last_job_id:
                    break
                await asyncio.sleep(0.05)
            job = (
                await jobs_pb2_grpc.JobServiceStub(channel).Get(
                    jobs_pb2.GetRequest(job_id=got.last_job_id), metadata=owner_metadata(OWNER)
                )
            ).job
            assert job.resource_id == "nightly@2026-06-01T12:01:00Z"
            assert got.next_fire_at.ToDatetime(tzinfo=UTC) == datetime(2026, 6, 1, 12, 2, tzinfo=UTC)
    finally:
        await app.stop()


async def _denied(stub, rpc: str, schedule_id: str, owner: str) -> dict[str, Any]:
    err = await expect_error(call(stub, rpc, schedule_id, owner), grpc.StatusCode.PERMISSION_DENIED)
    assert err.details() == f"schedule {schedule_id} not found or not accessible"
    return {
        "code": err.code(),
        "details": err.details(),
        "initial": list(err.initial_metadata() or ()),
        "trailing": list(err.trailing_metadata() or ()),
    }


@pytest.mark.parametrize("rpc", RPCS)
async def test_another_owners_schedule_is_denied_exactly_as_a_missing_one(schedules, app, rpc: str) -> None:
    """Same-length ids, so the bytes can be compared whole once swapped."""
    await create(schedules, schedule_id="owned-by-alice")
    foreign = await _denied(schedules, rpc, "owned-by-alice", OTHER_OWNER)
    missing = await _denied(schedules, rpc, "owned-by-nobod", OTHER_OWNER)

    def swap(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.replace(b"owned-by-nobod", b"owned-by-alice")
        return value.replace("owned-by-nobod", "owned-by-alice") if isinstance(value, str) else value

    assert any(key == "grpc-status-details-bin" for key, _ in foreign["trailing"])
    assert foreign == {
        "code": missing["code"],
        "details": swap(missing["details"]),
        "initial": [(k, swap(v)) for k, v in missing["initial"]],
        "trailing": [(k, swap(v)) for k, v in missing["trailing"]],
    }
    assert await _denied(schedules, rpc, "owned-by-alice", THIRD_OWNER) == foreign
    # And the owner's schedule is untouched by the probes.
    still = (await call(schedules, "GetSchedule", "owned-by-alice", OWNER)).schedule
    assert not still.paused and not still.last_job_id


async def test_another_owner_lists_nothing_and_may_reuse_the_id(schedules, app) -> None:
    await create(schedules, schedule_id="shared-name")
    listed = await schedules.ListSchedules(
        schedules_pb2.ListSchedulesRequest(), metadata=owner_metadata(OTHER_OWNER)
    )
    assert list(listed.schedules) == [] and not listed.next_page_token
    theirs = await create(schedules, owner=OTHER_OWNER, schedule_id="shared-name", cron="*/5 * * * *")
    assert theirs.cron == "*/5 * * * *"
    mine = (await call(schedules, "GetSchedule", "shared-name", OWNER)).schedule
    assert mine.cron == "0 3 * * *"


async def test_a_page_token_of_another_owner_is_refused(schedules, app) -> None:
    for name in ("a", "b"):
        await create(schedules, schedule_id=name)
    page = await schedules.ListSchedules(
        schedules_pb2.ListSchedulesRequest(page_size=1), metadata=owner_metadata(OWNER)
    )
    await expect_invalid(
        schedules.ListSchedules(
            schedules_pb2.ListSchedulesRequest(page_token=page.next_page_token),
            metadata=owner_metadata(OTHER_OWNER),
        ),
        "page_token",
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "0 3 * *"}, "cron"),
        ({"cron": "0 25 * * *"}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "R * * * *"}, "cron"),
        # Every match is a wall time New York's spring change skips.
        ({"cron": "30 2 * 3 0#2", "time_zone": "America/New_York"}, "cron"),
        ({"cron": "0 3 * * * 2027"}, "cron"),
        ({"time_zone": "Europe/Atlantis"}, "time_zone"),
        # Checked for length before it is looked up or echoed: INVALID_ARGUMENT,
        # never a trailer so large the client reads RESOURCE_EXHAUSTED.
        ({"time_zone": "Z" * 65}, "time_zone"),
        ({"time_zone": "Z" * 1_000_000}, "time_zone"),
        ({"catchup_window_seconds": -1}, "catchup_window_seconds"),
        ({"catchup_window_seconds": 400 * 86_400}, "catchup_window_seconds"),
        ({"schedule_id": ""}, "schedule_id"),
        ({"schedule_id": "has@sign"}, "schedule_id"),
        ({"schedule_id": "x" * 129}, "schedule_id"),
        ({"job": schedules_pb2.ScheduleJob(kind="no.such.kind")}, "job.kind"),
        ({"job": schedules_pb2.ScheduleJob(kind="example.echo", max_attempts=-1)}, "job.max_attempts"),
        ({"job": schedules_pb2.ScheduleJob(kind="example.echo", priority=9)}, "job.priority"),
        ({"overlap": 7}, "overlap"),
    ],
)
async def test_bad_input_names_the_field(schedules, app, fields: dict[str, Any], field: str) -> None:
    await expect_invalid(
        schedules.CreateSchedule(create_request(**fields), metadata=owner_metadata(OWNER)), field
    )
    listed = await schedules.ListSchedules(
        schedules_pb2.ListSchedulesRequest(), metadata=owner_metadata(OWNER)
    )
    assert list(listed.schedules) == []  # nothing was written


async def test_a_missing_template_and_a_duplicate_id_get_their_statuses(schedules, app) -> None:
    request = create_request()
    request.ClearField("job")
    await expect_invalid(schedules.CreateSchedule(request, metadata=owner_metadata(OWNER)), "job")
    await create(schedules)
    err = await expect_error(create(schedules, cron="*/5 * * * *"), grpc.StatusCode.ALREADY_EXISTS)
    assert field_violations(err) == ["schedule_id"] and error_reason(err) == "SCHEDULE_EXISTS"
    assert (await call(schedules, "GetSchedule", "nightly", OWNER)).schedule.cron == "0 3 * * *"


async def test_enqueue_refuses_the_reserved_resource_type(stub, app) -> None:
    request = jobs_pb2.EnqueueRequest(
        kind="example.echo", resource_type="leasehold.schedule", resource_id="nightly@x"
    )
    await expect_invalid(stub.Enqueue(request, metadata=owner_metadata(OWNER)), "resource_type")


async def test_a_call_without_an_owner_is_unauthenticated(schedules, app) -> None:
    await expect_error(
        schedules.ListSchedules(schedules_pb2.ListSchedulesRequest(), metadata=()),
        grpc.StatusCode.UNAUTHENTICATED,
    )


async def test_a_server_down_for_3_hours_enqueues_what_the_catch_up_rule_says(database_url: str) -> None:
    """Two hourly schedules, windows of 0 and of an hour; the server stops at
    00:30 and a new one starts on the same database at 03:40. Its timer's first
    round (at start) skips 01:00, 02:00 and 03:00 for the first schedule, and
    enqueues only 03:00 for the second, skipping the two before it."""
    clock = ManualClock(datetime(2026, 6, 1, 0, 0, tzinfo=UTC))
    settings = Settings(
        database_url=database_url, listen="127.0.0.1:0", runtime=RuntimeSettings(poll_seconds=0.05)
    )

    async def serving() -> tuple[LeaseholdApp, grpc.aio.Channel]:
        app = LeaseholdApp(settings, clock=clock, registry=test_registry())
        port = await app.start()
        return app, grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    app, channel = await serving()
    stub = schedules_pb2_grpc.ScheduleServiceStub(channel)
    await create(stub, schedule_id="window-0", cron="0 * * * *", catchup_window_seconds=0)
    await create(stub, schedule_id="window-1h", cron="0 * * * *", catchup_window_seconds=3600)
    clock.advance(30 * 60)
    await channel.close()
    await app.stop()

    clock.advance(3 * 3600 + 10 * 60)  # 03:40
    app, channel = await serving()
    stub = schedules_pb2_grpc.ScheduleServiceStub(channel)
    try:
        for _ in range(200):
            states = [
                (await call(stub, "GetSchedule", name, OWNER)).schedule for name in ("window-0", "window-1h")
            ]
            if all(state.skipped_firings for state in states):
                break
            await asyncio.sleep(0.05)
        none, hour = states
        assert (none.skipped_firings, none.last_job_id) == (3, "")
        assert none.last_skip_reason == schedules_pb2.SKIP_REASON_CATCHUP_WINDOW
        assert hour.skipped_firings == 2 and hour.last_job_id
        assert hour.last_fire_at.ToDatetime(tzinfo=UTC) == datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
        for state in (none, hour):
            assert state.next_fire_at.ToDatetime(tzinfo=UTC) == datetime(2026, 6, 1, 4, 0, tzinfo=UTC)
        jobs = await jobs_pb2_grpc.JobServiceStub(channel).List(
            jobs_pb2.ListRequest(resource_type="leasehold.schedule"), metadata=owner_metadata(OWNER)
        )
        assert [job.resource_id for job in jobs.jobs] == ["window-1h@2026-06-01T03:00:00Z"]
    finally:
        await channel.close()
        await app.stop()

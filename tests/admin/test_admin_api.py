"""AdminService through a real server and channel (--auth token), on each SQL
engine: only the admin role gets in, stats and listings match the jobs made,
bulk actions and pauses act, and bad input names its field."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold._server.auth.settings import AuthSettings
from leasehold.v1 import admin_pb2, jobs_pb2
from tests.admin.helpers import Credentials, Stubs, admin_server, credentials, enqueue, list_every, stubs
from tests.api.helpers import error_reason, expect_error, expect_invalid, field_violations
from tests.auth.helpers import serving

QUEUED, FAILED = jobs_pb2.JOB_STATUS_QUEUED, jobs_pb2.JOB_STATUS_FAILED
SUCCEEDED, CANCELLED = jobs_pb2.JOB_STATUS_SUCCEEDED, jobs_pb2.JOB_STATUS_CANCELLED


@pytest.fixture
async def served(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[LeaseholdApp, Credentials]]:
    creds = credentials(tmp_path)
    async with admin_server(database_url, creds) as app:
        yield app, creds


@pytest.fixture
async def admin(served: tuple[LeaseholdApp, Credentials]) -> AsyncIterator[tuple[Stubs, Credentials]]:
    app, creds = served
    async with stubs(app) as s:
        yield s, creds


def _every_rpc(s: Stubs) -> list[tuple[str, object]]:
    everything = admin_pb2.JobFilter()
    return [
        ("GetQueueStats", lambda md: s.admin.GetQueueStats(admin_pb2.GetQueueStatsRequest(), metadata=md)),
        ("ListAllJobs", lambda md: s.admin.ListAllJobs(admin_pb2.ListAllJobsRequest(), metadata=md)),
        (
            "BulkCancel",
            lambda md: s.admin.BulkCancel(admin_pb2.BulkCancelRequest(filter=everything), metadata=md),
        ),
        (
            "BulkRetry",
            lambda md: s.admin.BulkRetry(admin_pb2.BulkRetryRequest(filter=everything), metadata=md),
        ),
        (
            "PauseKind",
            lambda md: s.admin.PauseKind(admin_pb2.PauseKindRequest(kind="media.resize"), metadata=md),
        ),
        (
            "ResumeKind",
            lambda md: s.admin.ResumeKind(admin_pb2.ResumeKindRequest(kind="media.resize"), metadata=md),
        ),
        ("ListWorkers", lambda md: s.admin.ListWorkers(admin_pb2.ListWorkersRequest(), metadata=md)),
    ]


async def test_owner_and_worker_credentials_are_refused_before_anything_is_read(
    admin: tuple[Stubs, Credentials],
) -> None:
    s, creds = admin
    job = await enqueue(s, creds.owner("alice"))
    for who in (creds.owner("alice"), creds.worker):
        for name, call in _every_rpc(s):
            err = await expect_error(call(who), grpc.StatusCode.PERMISSION_DENIED)  # type: ignore[operator]
            assert error_reason(err) == "ADMIN_ROLE_REQUIRED", name
            assert "alice" not in err.details() and "media" not in err.details(), name
    for name, call in _every_rpc(s):  # no credential at all is not a known caller
        err = await expect_error(call(()), grpc.StatusCode.UNAUTHENTICATED)  # type: ignore[operator]
        assert error_reason(err) == "ADMIN_UNAUTHENTICATED", name
    # Nothing was cancelled, paused or counted for them.
    got = await s.jobs.Get(jobs_pb2.GetRequest(job_id=job), metadata=creds.owner("alice"))
    assert got.job.status == QUEUED
    assert got.job.wait_reason != jobs_pb2.WAIT_REASON_PAUSED
    stats = await s.admin.GetQueueStats(admin_pb2.GetQueueStatsRequest(), metadata=creds.admin)
    assert [(k.kind, k.queued, k.paused) for k in stats.kinds] == [("media.resize", 1, False)]


async def test_stats_and_listing_show_every_owner(admin: tuple[Stubs, Credentials]) -> None:
    s, creds = admin
    made = []
    for index in range(7):
        owner = ("alice", "bob")[index % 2]
        made.append(
            (await enqueue(s, creds.owner(owner), "media.resize" if index % 3 else "report.x"), owner)
        )
    stats = await s.admin.GetQueueStats(admin_pb2.GetQueueStatsRequest(), metadata=creds.admin)
    assert [(k.kind, k.queued, k.running) for k in stats.kinds] == [
        ("media.resize", 4, 0),
        ("report.x", 3, 0),
    ]
    assert stats.oldest_queued_job_id == made[0][0]
    assert len(stats.finished_per_minute) == 60

    listed = await list_every(s, creds.admin, page_size=2)
    assert [(job.id, job.owner_id) for job in listed] == made[::-1]
    bobs = await list_every(s, creds.admin, 2, admin_pb2.JobFilter(owner_id="bob"))
    assert [job.id for job in bobs] == [job_id for job_id, owner in made[::-1] if owner == "bob"]
    reports = await list_every(s, creds.admin, 2, admin_pb2.JobFilter(kind="report.x", statuses=[QUEUED]))
    assert [job.id for job in reports] == [made[6][0], made[3][0], made[0][0]]


async def test_page_tokens_are_bound_to_the_filter_and_to_the_admin(admin: tuple[Stubs, Credentials]) -> None:
    s, creds = admin
    for _ in range(3):
        await enqueue(s, creds.owner("alice"))
    page = await s.admin.ListAllJobs(admin_pb2.ListAllJobsRequest(page_size=1), metadata=creds.admin)
    assert page.next_page_token
    other_filter = admin_pb2.ListAllJobsRequest(
        page_size=1, page_token=page.next_page_token, filter=admin_pb2.JobFilter(owner_id="alice")
    )
    await expect_invalid(s.admin.ListAllJobs(other_filter, metadata=creds.admin), "page_token")
    owners = await s.jobs.List(jobs_pb2.ListRequest(page_size=1), metadata=creds.owner("alice"))
    with_owners_token = admin_pb2.ListAllJobsRequest(page_size=1, page_token=owners.next_page_token)
    await expect_invalid(s.admin.ListAllJobs(with_owners_token, metadata=creds.admin), "page_token")
    admins_token = jobs_pb2.ListRequest(page_size=1, page_token=page.next_page_token)
    await expect_invalid(s.jobs.List(admins_token, metadata=creds.owner("alice")), "page_token")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (
            lambda s, md: s.admin.ListAllJobs(admin_pb2.ListAllJobsRequest(page_size=-1), metadata=md),
            "page_size",
        ),
        (
            lambda s, md: s.admin.ListAllJobs(
                admin_pb2.ListAllJobsRequest(filter=admin_pb2.JobFilter(statuses=[0])), metadata=md
            ),
            "filter.statuses",
        ),
        (
            lambda s, md: s.admin.ListAllJobs(
                admin_pb2.ListAllJobsRequest(filter=admin_pb2.JobFilter(owner_id="x" * 129)), metadata=md
            ),
            "filter.owner_id",
        ),
        (
            lambda s, md: s.admin.BulkCancel(
                admin_pb2.BulkCancelRequest(filter=admin_pb2.JobFilter(statuses=[SUCCEEDED])), metadata=md
            ),
            "filter.statuses",
        ),
        (
            lambda s, md: s.admin.BulkRetry(
                admin_pb2.BulkRetryRequest(filter=admin_pb2.JobFilter(statuses=[QUEUED])), metadata=md
            ),
            "filter.statuses",
        ),
        (
            lambda s, md: s.admin.BulkCancel(
                admin_pb2.BulkCancelRequest(filter=admin_pb2.JobFilter(kind="Not A Kind")), metadata=md
            ),
            "filter.kind",
        ),
        (lambda s, md: s.admin.PauseKind(admin_pb2.PauseKindRequest(kind=""), metadata=md), "kind"),
        (lambda s, md: s.admin.ResumeKind(admin_pb2.ResumeKindRequest(kind="a b"), metadata=md), "kind"),
    ],
    ids=[
        "page_size",
        "unknown status",
        "owner_id",
        "cancel finished",
        "retry queued",
        "filter kind",
        "pause",
        "resume",
    ],
)
async def test_bad_input_names_the_field(admin: tuple[Stubs, Credentials], call: object, field: str) -> None:
    s, creds = admin
    await expect_invalid(call(s, creds.admin), field)  # type: ignore[operator]


async def test_bulk_cancel_and_retry_by_filter(admin: tuple[Stubs, Credentials]) -> None:
    s, creds = admin
    alices = [await enqueue(s, creds.owner("alice")) for _ in range(4)]
    bobs = [await enqueue(s, creds.owner("bob")) for _ in range(2)]
    alice_only = admin_pb2.JobFilter(owner_id="alice", kind="media.resize")

    dry = await s.admin.BulkCancel(
        admin_pb2.BulkCancelRequest(filter=alice_only, dry_run=True), metadata=creds.admin
    )
    assert (dry.matched, dry.dry_run) == (4, True)
    cancelled = await s.admin.BulkCancel(admin_pb2.BulkCancelRequest(filter=alice_only), metadata=creds.admin)
    assert (cancelled.matched, cancelled.dry_run) == (4, False)
    for job_id in alices:
        got = await s.jobs.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=creds.owner("alice"))
        assert got.job.status == CANCELLED
    for job_id in bobs:
        got = await s.jobs.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=creds.owner("bob"))
        assert got.job.status == QUEUED

    # Statuses alone name every owner's jobs: a dry run counts them, acting needs confirm_all.
    retry = admin_pb2.BulkRetryRequest(filter=admin_pb2.JobFilter(statuses=[CANCELLED]), confirm_all=True)
    dry_retry = await s.admin.BulkRetry(
        admin_pb2.BulkRetryRequest(filter=retry.filter, dry_run=True), metadata=creds.admin
    )
    assert dry_retry.matched == 4
    unconfirmed = admin_pb2.BulkRetryRequest(filter=retry.filter)
    err = await expect_error(
        s.admin.BulkRetry(unconfirmed, metadata=creds.admin), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert field_violations(err) == ["confirm_all"]
    assert (
        await s.admin.BulkRetry(
            admin_pb2.BulkRetryRequest(filter=retry.filter, dry_run=True), metadata=creds.admin
        )
    ).matched == 4  # nothing was retried
    assert (await s.admin.BulkRetry(retry, metadata=creds.admin)).matched == 4
    assert (await s.admin.BulkRetry(retry, metadata=creds.admin)).matched == 0  # run twice: no doubles
    queued = await list_every(s, creds.admin, 50, admin_pb2.JobFilter(owner_id="alice", statuses=[QUEUED]))
    assert sorted(job.retry_of_job_id for job in queued) == sorted(alices)
    # A kind nobody runs is refused, as Retry refuses it.
    unserved = admin_pb2.BulkRetryRequest(filter=admin_pb2.JobFilter(kind="nobody.runs"))
    err = await expect_error(
        s.admin.BulkRetry(unserved, metadata=creds.admin), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert error_reason(err) == "KIND_NOT_SERVED"


async def test_the_admins_view_of_a_job_shows_its_place_in_a_graph(admin: tuple[Stubs, Credentials]) -> None:
    s, creds = admin
    parent = await enqueue(s, creds.owner("alice"))  # a remote kind no worker runs: it stays queued
    child = await enqueue(
        s, creds.owner("alice"), depends_on=[parent], on_parent_failure=jobs_pb2.PARENT_FAILURE_POLICY_RUN
    )

    listed = {
        job.id: job for job in await list_every(s, creds.admin, 50, admin_pb2.JobFilter(owner_id="alice"))
    }

    assert (list(listed[child].depends_on), listed[child].pending_dependencies) == ([parent], 1)
    assert listed[child].on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_RUN
    assert not listed[child].HasField("available_at")
    assert list(listed[parent].depends_on) == [] and listed[parent].HasField("available_at")


async def test_a_paused_kind_waits_with_its_reason_and_runs_once_resumed(
    admin: tuple[Stubs, Credentials],
) -> None:
    s, creds = admin
    paused = await s.admin.PauseKind(admin_pb2.PauseKindRequest(kind="example.echo"), metadata=creds.admin)
    assert (paused.kind, paused.paused) == ("example.echo", True)
    job = await enqueue(s, creds.owner("alice"), "example.echo")
    got = await s.jobs.Get(jobs_pb2.GetRequest(job_id=job), metadata=creds.owner("alice"))
    assert (got.job.status, got.job.wait_reason) == (QUEUED, jobs_pb2.WAIT_REASON_PAUSED)
    stats = await s.admin.GetQueueStats(admin_pb2.GetQueueStatsRequest(), metadata=creds.admin)
    assert [(k.kind, k.paused) for k in stats.kinds] == [("example.echo", True)]

    resumed = await s.admin.ResumeKind(admin_pb2.ResumeKindRequest(kind="example.echo"), metadata=creds.admin)
    assert (resumed.kind, resumed.paused) == ("example.echo", False)
    events = s.jobs.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job), metadata=creds.owner("alice"))
    async for response in events:
        if response.event.type == "job.succeeded":
            break
    got = await s.jobs.Get(jobs_pb2.GetRequest(job_id=job), metadata=creds.owner("alice"))
    assert got.job.status == SUCCEEDED


async def test_many_dashboards_at_once_cost_one_read(served: tuple[LeaseholdApp, Credentials]) -> None:
    app, creds = served
    assert app.admin_servicer is not None
    async with stubs(app) as s:
        await enqueue(s, creds.owner("alice"))
        request = admin_pb2.GetQueueStatsRequest()
        answers = await asyncio.gather(
            *(s.admin.GetQueueStats(request, metadata=creds.admin) for _ in range(20))
        )
    # Read from the database once, at one moment, for all twenty (each read stamps its own time).
    assert len({answer.computed_at.ToDatetime() for answer in answers}) == 1
    assert app.admin_servicer.stats.reads == 1


async def test_header_mode_has_no_admin_role(tmp_path: Path) -> None:
    async with serving(tmp_path, AuthSettings(mode="header")) as app, stubs(app) as s:
        request = admin_pb2.GetQueueStatsRequest()
        err = await expect_error(
            s.admin.GetQueueStats(request, metadata=(("x-owner-id", "alice"),)),
            grpc.StatusCode.UNAUTHENTICATED,
        )
        assert error_reason(err) == "ADMIN_UNAUTHENTICATED"
        assert "no admin role" in err.details()

"""`--auth token`: each credential is accepted or refused, and yields the
owner or role its token-file line grants, on every service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from leasehold._server.app import LeaseholdApp
from leasehold._server.auth.settings import AuthSettings
from tests.api.helpers import error_reason, expect_error, field_violations
from tests.auth.helpers import RPCS, case_ids, claim, code_of, connect, enqueue, list_jobs, serving
from tests.credentials import bearer, token_file

OK = grpc.StatusCode.OK
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
ROLES = ("owner:alice", "owner:bob", "worker", "worker:media.*", "admin")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[LeaseholdApp, dict[str, str]]]:
    path, tokens = token_file(tmp_path / "tokens", *ROLES)
    async with serving(tmp_path, AuthSettings(mode="token", token_file=str(path))) as app:
        yield app, dict(zip(ROLES, tokens, strict=True))


# (case, metadata from the tokens, service) -> the status; the auth matrix's token rows.
CASES = [
    ("missing", lambda t: (), "JobService", UNAUTHENTICATED),
    ("wrong token", lambda t: bearer("lh_not-a-token-anyone-was-given"), "JobService", UNAUTHENTICATED),
    ("not Bearer", lambda t: (("authorization", t["owner:alice"]),), "JobService", UNAUTHENTICATED),
    ("owner header only", lambda t: (("x-owner-id", "alice"),), "JobService", UNAUTHENTICATED),
    ("owner", lambda t: bearer(t["owner:alice"]), "JobService", OK),
    ("owner", lambda t: bearer(t["owner:alice"]), "ScheduleService", OK),
    ("owner", lambda t: bearer(t["owner:alice"]), "WorkerService", UNAUTHENTICATED),
    ("worker", lambda t: bearer(t["worker"]), "JobService", UNAUTHENTICATED),
    ("worker", lambda t: bearer(t["worker"]), "ScheduleService", UNAUTHENTICATED),
    ("worker", lambda t: bearer(t["worker"]), "WorkerService", OK),
    ("worker:media.*", lambda t: bearer(t["worker:media.*"]), "WorkerService", OK),
    ("admin", lambda t: bearer(t["admin"]), "JobService", UNAUTHENTICATED),
    ("admin", lambda t: bearer(t["admin"]), "WorkerService", UNAUTHENTICATED),
]


@pytest.mark.parametrize(("case", "metadata", "service", "expected"), CASES, ids=case_ids(CASES))
async def test_each_credential_gets_its_status(served, case, metadata, service, expected) -> None:
    app, tokens = served
    async with connect(app) as channel:
        assert await code_of(RPCS[service](channel, metadata(tokens))) == expected


async def test_a_refusal_names_the_service_role_and_never_the_token(served) -> None:
    app, tokens = served
    async with connect(app) as channel:
        worker = await expect_error(list_jobs(channel, bearer(tokens["worker"])), UNAUTHENTICATED)
        assert error_reason(worker) == "OWNER_UNRESOLVED"
        assert worker.details() == "a worker credential cannot act as an owner"
        wrong = await expect_error(list_jobs(channel, bearer("lh_planted-wrong-token")), UNAUTHENTICATED)
        assert wrong.details() == "the bearer token is not valid"
        assert "planted" not in str(wrong.trailing_metadata())


async def test_the_owner_is_the_tokens_and_only_its_jobs_are_seen(served) -> None:
    app, tokens = served
    async with connect(app) as channel:
        job = (await enqueue(channel, bearer(tokens["owner:alice"]), "media.resize")).job
        assert [j.id for j in (await list_jobs(channel, bearer(tokens["owner:alice"]))).jobs] == [job.id]
        assert (await list_jobs(channel, bearer(tokens["owner:bob"]))).jobs == []
        # The worker that claims it learns whose job it is: the token's owner.
        claimed = await claim(channel, bearer(tokens["worker:media.*"]), "media.resize")
        assert [(c.job.id, c.owner_id) for c in claimed.jobs] == [(job.id, "alice")]


async def test_a_worker_limited_to_media_cannot_claim_report_x(served) -> None:
    app, tokens = served
    async with connect(app) as channel:
        await enqueue(channel, bearer(tokens["owner:alice"]), "report.x")
        err = await expect_error(
            claim(channel, bearer(tokens["worker:media.*"]), "media.resize", "report.x"),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        assert error_reason(err) == "KINDS_NOT_PERMITTED"
        assert field_violations(err) == ["kinds[1]"]
        # Nothing was taken: an unrestricted worker still finds the job queued.
        assert len((await claim(channel, bearer(tokens["worker"]), "report.x")).jobs) == 1


async def test_health_needs_no_credential(served) -> None:
    app, _ = served
    async with connect(app) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert response.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(("listen", "warned"), [("0.0.0.0:0", True), ("127.0.0.1:0", False)])
async def test_plaintext_tokens_beyond_loopback_are_warned_about(
    tmp_path: Path, listen: str, warned: bool
) -> None:
    path, _ = token_file(tmp_path / "tokens", "owner:alice")
    with structlog.testing.capture_logs() as records:
        async with serving(tmp_path, AuthSettings(mode="token", token_file=str(path)), listen=listen):
            pass
    assert any(record["event"] == "server.plaintext_credentials" for record in records) is warned

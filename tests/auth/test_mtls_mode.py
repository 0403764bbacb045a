"""`--auth mtls`: the TLS handshake requires a client certificate from
`--tls-client-ca`; the identity is its `leasehold:` URI SAN, else its CN."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from leasehold._server.app import LeaseholdApp
from leasehold._server.auth.settings import AuthSettings
from tests.api.helpers import error_reason, expect_error
from tests.auth.helpers import RPCS, case_ids, claim, code_of, connect, enqueue, list_jobs, serving
from tests.credentials import Authority

OK = grpc.StatusCode.OK
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
# A refused handshake never reaches the service: the client sees the transport fail.
HANDSHAKE_REFUSED = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[LeaseholdApp, Authority]]:
    authority = Authority(tmp_path)
    server = authority.server()
    auth = AuthSettings(
        mode="mtls",
        tls_cert=str(server.cert_file),
        tls_key=str(server.key_file),
        tls_client_ca=str(authority.cert_file),
    )
    async with serving(tmp_path, auth) as app:
        yield app, authority


# (case, the client certificate, service) -> status; the auth matrix's mtls rows.
CASES = [
    ("CN owner", lambda ca: ca.client("alice"), "JobService", OK),
    ("CN owner", lambda ca: ca.client("alice"), "ScheduleService", OK),
    ("CN owner", lambda ca: ca.client("alice"), "WorkerService", UNAUTHENTICATED),
    ("URI owner", lambda ca: ca.client("ignored", "leasehold:owner:alice"), "JobService", OK),
    ("URI worker", lambda ca: ca.client("w1", "leasehold:worker"), "WorkerService", OK),
    ("URI worker", lambda ca: ca.client("w1", "leasehold:worker"), "JobService", UNAUTHENTICATED),
    ("URI admin", lambda ca: ca.client("ops", "leasehold:admin"), "JobService", UNAUTHENTICATED),
    ("CN not an owner id", lambda ca: ca.client("Jane Doe"), "JobService", UNAUTHENTICATED),
    ("bad leasehold: URI", lambda ca: ca.client("x", "leasehold:root"), "JobService", UNAUTHENTICATED),
    (
        "two leasehold: URIs",
        lambda ca: ca.client("x", "leasehold:admin", "leasehold:worker"),
        "JobService",
        UNAUTHENTICATED,
    ),
    ("other URI SANs ignored", lambda ca: ca.client("alice", "spiffe://test/alice"), "JobService", OK),
    (
        "untrusted CA",
        lambda ca: Authority(ca.directory, "Other CA").client("alice"),
        "JobService",
        HANDSHAKE_REFUSED,
    ),
    ("no client certificate", lambda ca: None, "JobService", HANDSHAKE_REFUSED),
]


@pytest.mark.parametrize(("case", "cert", "service", "expected"), CASES, ids=case_ids(CASES))
async def test_each_certificate_gets_its_status(served, case, cert, service, expected) -> None:
    app, authority = served
    async with connect(app, ca=authority.cert, client=cert(authority)) as channel:
        assert await code_of(RPCS[service](channel, ())) == expected, case


async def test_plaintext_is_refused(served) -> None:
    app, _ = served
    async with connect(app) as channel:
        assert await code_of(list_jobs(channel)) == HANDSHAKE_REFUSED


async def test_the_certificate_names_the_owner_and_the_workers_kinds(served) -> None:
    app, authority = served
    alice, bob = authority.client("alice"), authority.client("bob")
    media = authority.client("transcoder", "leasehold:worker:media.*")
    async with (
        connect(app, ca=authority.cert, client=alice) as as_alice,
        connect(app, ca=authority.cert, client=bob) as as_bob,
        connect(app, ca=authority.cert, client=media) as as_media,
    ):
        job = (await enqueue(as_alice, (), "media.resize")).job
        assert (await list_jobs(as_bob)).jobs == []
        claimed = await claim(as_media, (), "media.resize")
        assert [(c.job.id, c.owner_id) for c in claimed.jobs] == [(job.id, "alice")]
        err = await expect_error(claim(as_media, (), "report.x"), grpc.StatusCode.PERMISSION_DENIED)
        assert error_reason(err) == "KINDS_NOT_PERMITTED"


async def test_health_asks_for_no_role(served) -> None:
    """The handshake still wants a trusted certificate; any one will do."""
    app, authority = served
    anyone = authority.client("Load Balancer Probe")  # not even a valid owner id
    async with connect(app, ca=authority.cert, client=anyone) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert response.status == health_pb2.HealthCheckResponse.SERVING

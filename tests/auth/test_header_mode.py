"""`--auth header`, the default: the secure default refuses a plaintext
listener beyond loopback, and TLS serves the same trusted header."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from leasehold._server.auth.settings import AuthSettings
from leasehold._server.config import Settings
from tests.auth.helpers import RPCS, case_ids, code_of, connect, list_jobs, serving
from tests.credentials import Authority, bearer
from tests.support import owner_metadata
from tests.system.helpers import run_cli


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", "10.1.2.3:50051", "jobs.internal:50051"])
def test_plaintext_header_auth_beyond_loopback_is_refused(listen: str) -> None:
    with pytest.raises(ValueError) as caught:
        Settings(listen=listen)
    assert str(caught.value).startswith("listen: --auth header trusts the x-owner-id header")
    assert "--allow-insecure-header-auth" in str(caught.value)


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "localhost:0", "[::1]:0", "127.0.0.2:0"])
def test_loopback_is_allowed(listen: str) -> None:
    assert Settings(listen=listen).auth.mode == "header"


def test_the_refusal_can_be_overridden_or_avoided() -> None:
    Settings(listen="0.0.0.0:50051", auth=AuthSettings(allow_insecure_header_auth=True))
    Settings(listen="0.0.0.0:50051", auth=AuthSettings(tls_cert="c.pem", tls_key="k.pem"))
    Settings(listen="0.0.0.0:50051", auth=AuthSettings(mode="token", token_file="tokens"))


def test_serve_refuses_it_with_exit_2_naming_the_flag() -> None:
    result = run_cli("serve", "--listen", "0.0.0.0:50051", timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("leasehold: listen: --auth header trusts the x-owner-id header")
    assert "--allow-insecure-header-auth" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--auth", "kerberos"], "auth: one of header, token, jwt, mtls"),
        (["--auth", "token"], "token_file: --auth token needs --token-file FILE"),
        (["--auth", "jwt", "--jwt-key-file", "k"], "jwt_issuer: --auth jwt needs --jwt-issuer"),
        (["--auth", "mtls"], "tls_client_ca: --auth mtls needs --tls-client-ca, --tls-cert and --tls-key"),
        (["--tls-cert", "c.pem"], "tls_cert: --tls-cert and --tls-key go together"),
        (["--max-calls-per-owner", "0"], "max_calls_per_owner: must be at least 1"),
        (["--max-calls-per-owner", "many"], "--max-calls-per-owner: expected an integer, got 'many'"),
    ],
)
def test_bad_auth_flags_are_one_line_naming_the_flag(args: list[str], message: str) -> None:
    result = run_cli("serve", *args, timeout=30)
    assert (result.returncode, result.stderr) == (2, f"leasehold: {message}\n")


async def test_header_auth_over_tls_on_every_interface(tmp_path: Path) -> None:
    authority = Authority(tmp_path)
    server = authority.server()
    auth = AuthSettings(tls_cert=str(server.cert_file), tls_key=str(server.key_file))
    async with serving(tmp_path, auth, listen="0.0.0.0:0") as app:
        async with connect(app, ca=authority.cert) as channel:
            assert await code_of(list_jobs(channel, owner_metadata())) == grpc.StatusCode.OK
            assert await code_of(list_jobs(channel)) == grpc.StatusCode.UNAUTHENTICATED
        async with connect(app) as plaintext:
            assert await code_of(list_jobs(plaintext, owner_metadata())) == grpc.StatusCode.UNAVAILABLE


WORKER_TOKEN = "the-shared-worker-token-0123456789"
# (case, metadata, service) -> status; the auth matrix's header rows.
CASES = [
    ("missing", (), "JobService", grpc.StatusCode.UNAUTHENTICATED),
    ("malformed owner", (("x-owner-id", "has space"),), "JobService", grpc.StatusCode.UNAUTHENTICATED),
    ("owner header", owner_metadata(), "JobService", grpc.StatusCode.OK),
    ("owner header", owner_metadata(), "ScheduleService", grpc.StatusCode.OK),
    ("owner header", owner_metadata(), "WorkerService", grpc.StatusCode.UNAUTHENTICATED),
    ("worker token", bearer(WORKER_TOKEN), "WorkerService", grpc.StatusCode.OK),
    (
        "worker token + owner header",
        (*bearer(WORKER_TOKEN), *owner_metadata()),
        "JobService",
        grpc.StatusCode.UNAUTHENTICATED,
    ),
    (
        "wrong worker token",
        bearer("not-the-worker-token-at-all"),
        "WorkerService",
        grpc.StatusCode.UNAUTHENTICATED,
    ),
]


@pytest.mark.parametrize(("case", "metadata", "service", "expected"), CASES, ids=case_ids(CASES))
async def test_each_credential_gets_its_status(tmp_path: Path, case, metadata, service, expected) -> None:
    async with serving(tmp_path, AuthSettings(), worker_token=WORKER_TOKEN) as app, connect(app) as channel:
        assert await code_of(RPCS[service](channel, metadata)) == expected, case

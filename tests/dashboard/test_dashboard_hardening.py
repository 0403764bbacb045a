"""What the dashboard refuses, as a process: a sign-in token far longer than
any the API takes is a 401 like any wrong token (it used to reach the API and
come back RESOURCE_EXHAUSTED, shown as a 429); a Host it was not told to
answer to is a 400 (redirects and form actions are built from it, so any Host
would let a rebound DNS name drive a signed-in session); X-Forwarded-Proto
counts only from --forwarded-allow-ips; HSTS is sent under TLS only; a live
event stream ends when its viewer's token is revoked."""

from __future__ import annotations

import http.client
import signal
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.credentials import Authority, bearer, token_file
from tests.dashboard.test_serve import Browserless
from tests.support import sqlite_url
from tests.system.helpers import Leasehold

pytestmark = pytest.mark.slow


@pytest.fixture
def token_dashboard(tmp_path: Path, processes: Callable[[Leasehold], Leasehold]) -> tuple[Browserless, str]:
    dashboard = ("--dashboard-listen", "127.0.0.1:0")
    server, _, (ann,) = Leasehold.serve_with_tokens(tmp_path, ("owner:ann",), *dashboard)
    processes(server).start()
    return Browserless(str(server.started.dashboard)), ann


def test_a_revoked_token_ends_its_live_event_stream(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    path, (ann, bob) = token_file(tmp_path / "tokens", "owner:ann", "owner:bob")
    server = processes(
        Leasehold.serve(
            sqlite_url(tmp_path),
            "--auth",
            "token",
            "--token-file",
            str(path),
            "--dashboard-listen",
            "127.0.0.1:0",
        )
    )
    port = server.start()
    web = Browserless(str(server.started.dashboard))
    assert web.sign_in(ann)[0] == 200
    payload = struct_pb2.Struct()
    payload.update({"seconds": 600, "steps": 1})  # started, then quiet for ten minutes
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = jobs_pb2.EnqueueRequest(kind="example.sleep", payload=payload)
        job = jobs_pb2_grpc.JobServiceStub(channel).Enqueue(request, metadata=bearer(ann), timeout=15).job
    # Each read waits at most the stream's socket timeout (15 s): a stream that
    # outlived its credential would time out here instead of ending.
    with web.open_stream(f"/jobs/{job.id}/events") as stream:
        lines = iter(stream.readline, b"")
        assert any(b'"job.started"' in line for line in lines)
        # and the status message that follows it, whose Get would otherwise be
        # refused after the reload and end the stream before its watch is tested
        assert any(line.startswith(b'data: {"status": "running"') for line in lines)

        path.write_text("\n".join(line for line in path.read_text().splitlines() if "owner:ann" not in line))
        assert server.process is not None
        server.process.send_signal(signal.SIGHUP)

        rest = b"".join(lines)  # to the end of the stream
    assert b'event: failure\ndata: {"code": "UNAUTHENTICATED"}' in rest
    assert server.events("auth.token_file_reloaded")
    assert bob not in server.output and ann not in server.output


@pytest.mark.parametrize("length", [16 * 1024 + 1, 100 * 1024])
def test_an_oversized_sign_in_token_is_a_401(token_dashboard: tuple[Browserless, str], length: int) -> None:
    web, ann = token_dashboard
    status, landed, page = web.sign_in("x" * length)
    assert (status, landed.removeprefix(web.base)) == (401, "/signin")
    assert "that token was not accepted" in page
    status, landed, _ = web.sign_in(ann)  # and the right one still signs in
    assert (status, landed.removeprefix(web.base)) == (200, "/overview")


def _get(base: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """One request, redirects not followed: the status and the headers."""
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=15)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, {name.lower(): value for name, value in response.getheaders()}
    finally:
        connection.close()


@pytest.fixture
def header_dashboard(processes: Callable[[Leasehold], Leasehold], tmp_path: Path) -> Callable[..., str]:
    """Starts a header-mode server with a dashboard (each with its own database);
    returns the dashboard's URL."""
    started = iter(range(100))

    def start(*extra: str) -> str:
        database = sqlite_url(tmp_path, f"dashboard-{next(started)}.db")
        server = processes(Leasehold.serve(database, "--dashboard-listen", "127.0.0.1:0", *extra))
        server.start()
        return str(server.started.dashboard)

    return start


def test_only_allowed_host_names_are_answered(header_dashboard: Callable[..., str]) -> None:
    base = header_dashboard()
    port = urllib.parse.urlsplit(base).port
    assert _get(base, "/signin", {"Host": f"127.0.0.1:{port}"})[0] == 200
    assert _get(base, "/signin", {"Host": f"localhost:{port}"})[0] == 200
    # DNS rebinding: a page of attacker.example whose name now points here.
    assert _get(base, "/signin", {"Host": "attacker.example"})[0] == 400
    status, headers = _get(base, "/", {"Host": "attacker.example"})
    assert status == 400 and "location" not in headers

    named = header_dashboard("--dashboard-allowed-hosts", "jobs.example.com")
    assert _get(named, "/signin", {"Host": "jobs.example.com"})[0] == 200
    assert _get(named, "/signin", {"Host": "localhost"})[0] == 400


def test_forwarded_headers_count_only_from_named_proxies(header_dashboard: Callable[..., str]) -> None:
    forwarded = {"Host": "localhost", "X-Forwarded-Proto": "https"}
    status, headers = _get(header_dashboard(), "/", forwarded)
    assert status in (303, 307) and headers["location"].startswith("http://localhost/")

    status, headers = _get(header_dashboard("--forwarded-allow-ips", "127.0.0.1"), "/", forwarded)
    assert status in (303, 307) and headers["location"].startswith("https://localhost/")


def test_hsts_only_under_tls(tmp_path: Path, processes: Callable[[Leasehold], Leasehold]) -> None:
    authority = Authority(tmp_path)
    issued = authority.server()
    server, _, _ = Leasehold.serve_with_tokens(
        tmp_path,
        ("owner:ann",),
        *("--tls-cert", str(issued.cert_file), "--tls-key", str(issued.key_file)),
        *("--dashboard-listen", "127.0.0.1:0"),
    )
    processes(server)
    server.start()
    url = str(server.started.dashboard)
    context = ssl.create_default_context(cafile=str(authority.cert_file))
    with urllib.request.urlopen(url + "signin", context=context, timeout=15) as response:
        assert response.headers["Strict-Transport-Security"] == "max-age=31536000"


def test_no_hsts_over_plain_http(header_dashboard: Callable[..., str]) -> None:
    status, headers = _get(header_dashboard(), "/signin", {"Host": "localhost"})
    assert status == 200 and "strict-transport-security" not in headers

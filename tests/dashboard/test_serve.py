"""`serve --dashboard-listen` as a process, without a browser: the flag and
its LEASEHOLD_DASHBOARD_LISTEN variable, the configurations it refuses in one
line, HTTPS with the service's own certificate (the dashboard still reaching a
TLS-only gRPC port), and sign-in by owner id in --auth header mode."""

from __future__ import annotations

import http.client
import http.cookiejar
import re
import signal
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.credentials import Authority
from tests.support import owner_metadata, sqlite_url
from tests.system.helpers import EXIT_SECONDS, Leasehold, run_cli

pytestmark = pytest.mark.slow


class Browserless:
    """Cookies and forms over urllib, as a browser would send them."""

    def __init__(self, base: str, context: ssl.SSLContext | None = None) -> None:
        self.base = base.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPCookieProcessor(self.jar)]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def get(self, path: str) -> tuple[int, str, str]:
        return self._open(urllib.request.Request(self.base + path))

    def post(self, path: str, fields: dict[str, str]) -> tuple[int, str, str]:
        data = urllib.parse.urlencode(fields).encode()
        return self._open(urllib.request.Request(self.base + path, data=data, method="POST"))

    def _open(self, request: urllib.request.Request) -> tuple[int, str, str]:
        try:
            with self._opener.open(request, timeout=15) as response:
                return response.status, response.geturl(), response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.geturl(), err.read().decode()

    def open_stream(self, path: str) -> http.client.HTTPResponse:
        """A response to read as it arrives (an event stream)."""
        response: http.client.HTTPResponse = self._opener.open(self.base + path, timeout=15)
        return response

    def sign_in(self, secret: str) -> tuple[int, str, str]:
        _, _, form = self.get("/signin")
        match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', form)
        assert match is not None
        return self.post("/signin", {"csrf_token": match.group(1), "secret": secret})


MTLS = ("--auth", "mtls", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem")


@pytest.mark.parametrize(
    ("address", "extra", "words"),
    [
        ("127.0.0.1:0", MTLS, "leasehold: dashboard_listen: --auth mtls has no bearer credential"),
        ("nowhere", (), "leasehold: dashboard_listen: expected HOST:PORT, got 'nowhere'"),
        ("0.0.0.0:0", (), "leasehold: dashboard_listen: --auth header signs in with a bare owner id"),
        # TLS makes a header trustworthy behind a gateway, not a typed sign-in form.
        (
            "0.0.0.0:0",
            ("--tls-cert", "c.pem", "--tls-key", "k.pem"),
            "leasehold: dashboard_listen: --auth header signs in with a bare owner id",
        ),
    ],
)
def test_a_dashboard_it_cannot_serve_is_one_line_and_exit_2(
    tmp_path: Path, address: str, extra: tuple[str, ...], words: str
) -> None:
    result = run_cli("serve", "--database-url", sqlite_url(tmp_path), "--dashboard-listen", address, *extra)
    assert result.returncode == 2
    assert result.stderr.startswith(words) and result.stderr.count("\n") == 1, result.stderr


def test_a_busy_dashboard_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "serve", "--database-url", sqlite_url(tmp_path), "--listen", "127.0.0.1:0",
            env={"LEASEHOLD_DASHBOARD_LISTEN": f"127.0.0.1:{port}"},
        )  # fmt: skip
    assert result.returncode == 2
    assert f"leasehold: --dashboard-listen: cannot bind 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_under_tls_the_dashboard_is_https_with_secure_cookies_and_reaches_the_tls_api(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    authority = Authority(tmp_path)
    issued = authority.server()
    server, _, (ann,) = Leasehold.serve_with_tokens(
        tmp_path,
        ("owner:ann",),
        *("--tls-cert", str(issued.cert_file), "--tls-key", str(issued.key_file)),
        env={"LEASEHOLD_DASHBOARD_LISTEN": "127.0.0.1:0"},
    )
    processes(server)
    server.start()
    url = str(server.started.dashboard)
    assert url.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=str(authority.cert_file))
    web = Browserless(url, context)

    status, landed, page = web.sign_in(ann)
    assert (status, landed.removeprefix(web.base)) == (200, "/overview")
    assert "Your jobs at a glance" in page  # read over the private listener from a TLS-only service
    cookies = {cookie.name: cookie for cookie in web.jar}
    assert cookies["leasehold_session"].secure
    assert cookies["leasehold_session"].has_nonstandard_attr("HttpOnly")
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
        urllib.request.urlopen(url.replace("https://", "http://") + "signin", timeout=5)


def test_header_mode_signs_in_with_an_owner_id(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    server = processes(Leasehold.serve(sqlite_url(tmp_path), "--dashboard-listen", "127.0.0.1:0"))
    server.start()
    web = Browserless(str(server.started.dashboard))
    status, _, page = web.sign_in("not an owner id!")
    assert status == 401 and "that owner id was not accepted" in page
    status, landed, page = web.sign_in("ann")
    assert (status, landed.removeprefix(web.base)) == (200, "/overview")
    assert 'id="who">Signed in as owner ann<' in page
    # Signing out ends the session: its cookie no longer opens a page.
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert match is not None
    status, landed, _ = web.post("/signout", {"csrf_token": match.group(1)})
    assert landed.removeprefix(web.base) == "/signin"
    _, landed, _ = web.get("/jobs")
    assert landed.removeprefix(web.base) == "/signin"


def test_an_open_event_stream_does_not_hold_up_the_drain(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    server = processes(Leasehold.serve(sqlite_url(tmp_path), "--dashboard-listen", "127.0.0.1:0"))
    port = server.start()
    web = Browserless(str(server.started.dashboard))
    web.sign_in("ann")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        payload = struct_pb2.Struct()
        payload.update({"seconds": 60, "steps": 60})
        request = jobs_pb2.EnqueueRequest(kind="example.sleep", payload=payload)
        job = jobs_pb2_grpc.JobServiceStub(channel).Enqueue(request, metadata=owner_metadata("ann")).job
    stream = web.open_stream(f"/jobs/{job.id}/events")
    assert stream.readline() == b"retry: 2000\n"  # streaming

    took = server.interrupt(signum=signal.SIGTERM)
    print(f"drain with an open dashboard stream: {took:.2f} s")
    assert server.returncode == 0
    # Not held open by the stream, nor by the 60 s job: it is handed back after the grace.
    assert took < EXIT_SECONDS, f"the drain took {took:.1f} s with a dashboard stream open"
    stream.close()

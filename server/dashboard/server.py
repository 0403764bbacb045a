"""Serving the dashboard with uvicorn as one more task of the service's own
event loop, beside grpc.aio: no thread, no second loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

import structlog
import uvicorn

from leasehold._server.addresses import reason, split_address
from leasehold._server.clock import Clock
from leasehold._server.connections import ConnectionLimits
from leasehold._server.dashboard.app import build_app
from leasehold._server.dashboard.gateway import Gateway
from leasehold._server.dashboard.guarded_protocol import guarded_protocol
from leasehold._server.dashboard.identity import OwnerOf
from leasehold._server.dashboard.sessions import SessionStore
from leasehold._server.dashboard.templates import templates
from leasehold._server.dashboard.web import Dashboard

log = structlog.get_logger("leasehold.dashboard")
FLAG = "--dashboard-listen"
# Open event streams get this long to end when the service stops.
STOP_SECONDS = 1
# h11's own default, said out loud: a request line and headers larger than this
# get 400 rather than a growing buffer.
MAX_HEADERS_BYTES = 16 * 1024
# asyncio accepts up to the listen backlog in one go before any of those
# connections is counted against the cap: uvicorn's 2,048 would let one burst
# take that many descriptors at once.
LISTEN_BACKLOG = 128


class _InLoopServer(uvicorn.Server):
    """uvicorn without its signal handlers: the service owns SIGINT/SIGTERM
    (its drain), and uvicorn's would replace them. `listening` is set once it
    accepts connections."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class DashboardServer:
    def __init__(
        self,
        address: str,
        api_target: str,
        auth_mode: str,
        clock: Clock,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        owner_of: OwnerOf | None = None,
        allowed_hosts: tuple[str, ...] = (),
        forwarded_allow_ips: tuple[str, ...] = (),
        limits: ConnectionLimits | None = None,
        max_connections: int = 1_000,
    ) -> None:
        self._address = address
        self._limits = limits or ConnectionLimits()
        self._max_connections = max_connections
        self._tls = (tls_cert, tls_key) if tls_cert and tls_key else None
        # Redirects and form actions are built from the Host a browser sends:
        # only names the operator chose are answered (no DNS rebinding), and
        # only the named proxies may say the scheme was https.
        self.allowed_hosts = allowed_hosts or (split_address(address)[0], "localhost")
        self._forwarded_allow_ips = forwarded_allow_ips
        self.gateway = Gateway(api_target, auth_mode, owner_of)
        self.state = Dashboard(
            sessions=SessionStore(clock),
            gateway=self.gateway,
            templates=templates(),
            secure_cookies=self._tls is not None,
            clock=clock,
        )
        self._server: _InLoopServer | None = None
        self._task: asyncio.Task[None] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host, _ = split_address(self._address)
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self._tls else "http"
        return f"{scheme}://{host}:{self.port}/"

    async def start(self) -> int:
        """Bind (a bad or busy address is a ValueError naming the flag) and
        serve in the background; returns the bound port."""
        host, port = split_address(self._address)
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ValueError(f"{FLAG}: cannot bind {self._address}: {reason(exc)}") from None
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            build_app(self.state, self.allowed_hosts, hsts=self._tls is not None),
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            proxy_headers=bool(self._forwarded_allow_ips),
            forwarded_allow_ips=list(self._forwarded_allow_ips) or None,
            timeout_graceful_shutdown=STOP_SECONDS,
            # The headers' deadline and the connection cap; then uvicorn's own
            # bounds: the wait for the next request on a kept-alive connection
            # and the size of the headers. Not limit_concurrency: one request at
            # a time per HTTP/1.1 connection, so the cap bounds requests too, and
            # uvicorn counts connections against it as well, so idle ones filling
            # the cap would get every request on the open connections a 503.
            http=guarded_protocol(self._limits.handshake_timeout_seconds, self._max_connections),
            timeout_keep_alive=self._limits.dashboard_keep_alive_seconds,
            h11_max_incomplete_event_size=MAX_HEADERS_BYTES,
            backlog=LISTEN_BACKLOG,
            ssl_certfile=self._tls[0] if self._tls else None,
            ssl_keyfile=self._tls[1] if self._tls else None,
        )
        self._server = server = _InLoopServer(config)
        self._task = task = asyncio.create_task(server.serve(sockets=[sock]), name="dashboard")
        # Serving before start() returns, so the address logged at start-up answers.
        listening = asyncio.create_task(server.listening.wait())
        await asyncio.wait((task, listening), return_when=asyncio.FIRST_COMPLETED)
        if not server.listening.is_set():
            listening.cancel()
            raise ValueError(f"{FLAG}: cannot serve on {self._address}: {_failure(task)}")
        return self.port

    async def stop(self) -> None:
        """Stop accepting, end open pages and streams, close the API channel."""
        server, task = self._server, self._task
        self._server = self._task = None
        if server is not None and task is not None:
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.gateway.close()


def _failure(task: asyncio.Task[None]) -> str:
    exception = task.exception() if not task.cancelled() else None
    return str(exception) if exception is not None else "uvicorn stopped at start-up"


class PrivateListener:
    """Where the dashboard reaches this process's gRPC server: a Unix socket in
    a directory only this user can enter, served without TLS whatever the
    public listener does (so the dashboard needs no CA), and checked with the
    same credentials as every other call."""

    def __init__(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="leasehold-dashboard-")
        os.chmod(self._directory, 0o700)
        self.target = f"unix:{os.path.join(self._directory, 'grpc.sock')}"

    def remove(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)

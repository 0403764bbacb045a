"""The `/metrics` endpoint: prometheus-client's WSGI app on a threading server.

prometheus-client's own `start_http_server` gives each connection a thread and
never times one out: a connection that sends nothing holds its thread and its
descriptor for ever, and there is no cap on how many. This is the same server
with both bounds: a socket timeout (a connection must send its request within
it and read the response at that pace) and at most METRICS_MAX_CONNECTIONS
connections at once; above that, new ones are closed as soon as they are accepted.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry

from leasehold._server.addresses import reason, split_address
from leasehold._server.connections import DEFAULT_HANDSHAKE_TIMEOUT_SECONDS, METRICS_MAX_CONNECTIONS

FLAG = "--metrics-listen"


class _QuietHandler(WSGIRequestHandler):
    """No access log; `timeout` (set on a subclass) bounds every read and write."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: a scrape every few seconds is not news."""


class _CappedServer(ThreadingWSGIServer):
    """At most `max_connections` handled at once; one more is closed at once."""

    max_connections = METRICS_MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.Lock()
        self._open = 0
        super().__init__(*args, **kwargs)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._lock:
            if self._open >= self.max_connections:
                return False  # socketserver closes it
            self._open += 1
            return True

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open -= 1


class MetricsServer:
    """Serves `registry` in the Prometheus text format on HOST:PORT."""

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        timeout_seconds: float = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
    ) -> None:
        self._address = address
        self._registry = registry
        self._timeout_seconds = timeout_seconds
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0). A bad or
        busy address is a ValueError naming the flag."""
        host, port = split_address(self._address)
        handler = type("MetricsHandler", (_QuietHandler,), {"timeout": self._timeout_seconds})
        try:
            # As prometheus-client does: the family of what the host resolves to (IPv6 too).
            family, _, _, _, sockaddr = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            server_class = type("MetricsWSGIServer", (_CappedServer,), {"address_family": family})
            self._server = make_server(
                str(sockaddr[0]), port, make_wsgi_app(self._registry), server_class, handler_class=handler
            )
        except OSError as exc:  # busy, not ours to bind, or a host that does not resolve
            raise ValueError(f"{FLAG}: cannot bind {self._address}: {reason(exc)}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self.port = int(self._server.server_address[1])
        return self.port

    @property
    def url(self) -> str:
        """Where it serves, with the bound port."""
        host, _ = split_address(self._address)
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        where = self._address if self.port is None else f"{host}:{self.port}"
        return f"http://{where}/metrics"

    async def stop(self) -> None:
        """Stop serving. On a thread: a scrape in progress may be waiting for a
        queue read on the event loop, which must stay free to answer it."""
        server, self._server = self._server, None
        if server is None:
            return
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

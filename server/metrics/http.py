"""The `/metrics` endpoint: prometheus-client's own WSGI server, on a thread."""

from __future__ import annotations

import asyncio
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from leasehold._server.addresses import reason, split_address

FLAG = "--metrics-listen"


class MetricsServer:
    """Serves `registry` in the Prometheus text format on HOST:PORT."""

    def __init__(self, address: str, registry: CollectorRegistry) -> None:
        self._address = address
        self._registry = registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0). A bad or
        busy address is a ValueError naming the flag."""
        host, port = split_address(self._address)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self._registry)
        except OSError as exc:  # busy, not ours to bind, or a host that does not resolve
            raise ValueError(f"{FLAG}: cannot bind {self._address}: {reason(exc)}") from None
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

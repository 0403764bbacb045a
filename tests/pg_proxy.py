"""A TCP proxy in front of PostgreSQL that can lose one COMMIT's answer, or
cut the database off altogether.

Armed (`cut_next_commit`), it lets the next COMMIT that carries a NOTIFY (the writer sends a
batch's NOTIFYs with its COMMIT, and only a batch that made work or events has
any) through to the server, waits until the server has answered it, and then
drops that answer and closes both sides. The server has committed; the client
sees its connection break mid-COMMIT, and cannot know which way it went: the
one moment a database client can neither claim success nor failure.

Severed (`sever`), it closes every connection and every new one at once, as a
database that is down or out of reach; `heal` lets connections through again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

# The server's CommandComplete for a COMMIT: tag "COMMIT", NUL-terminated.
_COMMIT_DONE = b"COMMIT\x00"


@dataclass
class PostgresProxy:
    upstream_host: str
    upstream_port: int
    port: int = 0
    # COMMITs whose answer was dropped, after the server had given it.
    cut: int = 0
    _armed: bool = False
    _severed: bool = False
    _server: asyncio.Server | None = None
    _links: set[asyncio.Task[None]] = field(default_factory=set)

    def cut_next_commit(self) -> None:
        self._armed = True

    def sever(self) -> None:
        self._severed = True
        for link in list(self._links):
            link.cancel()

    def heal(self) -> None:
        self._severed = False

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._severed:
            client_writer.close()
            return
        server_reader, server_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        cutting = asyncio.Event()

        async def upstream() -> None:
            while data := await client_reader.read(65536):
                if self._armed and b"NOTIFY" in data and b"COMMIT" in data:
                    self._armed = False
                    cutting.set()
                server_writer.write(data)
                await server_writer.drain()

        async def downstream() -> None:
            while data := await server_reader.read(65536):
                if cutting.is_set() and _COMMIT_DONE in data:
                    self.cut += 1
                    return  # the answer goes nowhere; both sides are closed below
                client_writer.write(data)
                await client_writer.drain()

        links = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(links, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for link in links:
                link.cancel()
            for writer in (client_writer, server_writer):
                writer.close()
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await writer.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = asyncio.ensure_future(self._serve(reader, writer))
        self._links.add(link)
        link.add_done_callback(self._links.discard)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PostgresProxy]:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            self._server.close()
            for link in list(self._links):
                link.cancel()
            await asyncio.gather(*self._links, return_exceptions=True)

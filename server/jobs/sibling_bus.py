"""How the processes of one `serve --processes N` tell each other what they
committed to their shared SQLite file, as PostgreSQL replicas do with NOTIFY.

SQLite has no notifications: a process alone on its file learns of other
writers by polling the file's data version, which makes a watcher whose job
runs in another process up to a poll late. Siblings know each other, so each
one listens on a Unix socket in a private directory their supervisor made
(`<slot>.sock`), and after every commit that made work or events, sends each
sibling the same announcement a NOTIFY would carry (`announcements.payloads`,
one line each).

Nothing here is the truth: the events stay in the file. An announcement only
says where to read. So a sibling that cannot take one (not up yet, restarting,
or so far behind that its unread backlog passed `MAX_BACKLOG_BYTES`) is not
waited for: it is marked as having missed some, and the first line it gets on
the next connection, or once it has caught up, says "read everything once"
(`announcements.unknown_changes`). Nothing it should hear of is lost, and a
slow sibling never slows the writer down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from leasehold._server.jobs.announcements import parse, payloads, unknown_changes
from leasehold._server.jobs.notifications import ChangeHub

log = structlog.get_logger("leasehold.storage")

# Past this much unsent to one sibling, the rest is dropped for one "read everything".
MAX_BACKLOG_BYTES = 1 << 20
# A line is one payload (under 8,000 bytes); anything longer is not ours.
MAX_LINE_BYTES = 64 * 1024
RECONNECT_FIRST_SECONDS = 0.05
RECONNECT_MAX_SECONDS = 1.0


@dataclass(frozen=True)
class SiblingGroup:
    """This process's place among the `serve --processes` siblings: slot `slot`
    of `count`, their sockets in `directory`."""

    directory: str
    slot: int
    count: int

    def socket_of(self, slot: int) -> str:
        return os.path.join(self.directory, f"{slot}.sock")

    @property
    def others(self) -> list[int]:
        return [slot for slot in range(self.count) if slot != self.slot]


class SiblingBus:
    """Sends this process's announcements to its siblings (`tell`, called after
    each commit) and publishes theirs on `changes` (`run`, until cancelled)."""

    def __init__(self, group: SiblingGroup, changes: ChangeHub, origin: str) -> None:
        self._group = group
        self._changes = changes
        self._origin = origin
        self._peers = {slot: _Peer(group.socket_of(slot), origin) for slot in group.others}
        self.listening = asyncio.Event()

    def tell(self, work: bool, job_ids: list[str], feed_keys: list[str]) -> None:
        """On the event loop, after the commit: never waits for anyone."""
        lines = [payload.encode() + b"\n" for payload in payloads(self._origin, work, job_ids, feed_keys)]
        if lines:
            for peer in self._peers.values():
                peer.send(lines)

    async def run(self) -> None:
        path = self._group.socket_of(self._group.slot)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket left by this slot's previous process
        server = await asyncio.start_unix_server(self._serve_sibling, path=path, limit=MAX_LINE_BYTES)
        self.listening.set()
        try:
            async with server:
                await server.serve_forever()
        finally:
            self.listening.clear()
            for peer in self._peers.values():
                peer.close()
            with contextlib.suppress(FileNotFoundError):
                Path(path).unlink()

    async def _serve_sibling(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                announcement = parse(line.decode(errors="replace").rstrip("\n"))
                if announcement is None:
                    log.warning("storage.sibling_announcement_ignored", reason="not a leasehold payload")
                    continue
                announcement.publish(self._changes)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass  # the sibling went away, or sent what is not ours: its next connection starts afresh
        finally:
            writer.close()


class _Peer:
    """One sibling's end: a connection made on demand and made again after any
    failure, lines written without waiting, and whether it may have missed some."""

    def __init__(self, path: str, origin: str) -> None:
        self._path = path
        self._unknown = unknown_changes(origin).encode() + b"\n"
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._missed = True  # a new connection starts with "read everything"
        self._closed = False

    def send(self, lines: list[bytes]) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            self._writer = None
            self._missed = True
            self._connect_soon()
            return
        if writer.transport.get_write_buffer_size() > MAX_BACKLOG_BYTES:
            if not self._missed:
                self._missed = True
                asyncio.get_running_loop().create_task(
                    self._catch_up(writer), name="leasehold-sibling-catch-up"
                )
            return
        if self._missed:
            writer.write(self._unknown)
            self._missed = False
        writer.writelines(lines)

    async def _catch_up(self, writer: asyncio.StreamWriter) -> None:
        """Once the backlog it could not take is sent, "read everything", even
        if nothing more is committed after the lines it lost."""
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        if self._missed and self._writer is writer and not writer.is_closing():
            writer.write(self._unknown)
            self._missed = False

    def _connect_soon(self) -> None:
        if self._closed or (self._connecting is not None and not self._connecting.done()):
            return
        self._connecting = asyncio.get_running_loop().create_task(
            self._connect(), name="leasehold-sibling-connect"
        )

    async def _connect(self) -> None:
        delay = RECONNECT_FIRST_SECONDS
        while not self._closed:
            try:
                _, writer = await asyncio.open_unix_connection(self._path)
            except OSError:  # not listening yet, or gone: it reads the file afresh when it is back
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_SECONDS)
                continue
            writer.write(self._unknown)  # whatever it may have missed meanwhile
            self._missed = False
            self._writer = writer
            return

    def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._writer is not None:
            self._writer.close()

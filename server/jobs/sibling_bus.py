"""How the processes of one `serve --processes N` hand each other what they
committed to their shared SQLite file, as PostgreSQL replicas hear it by NOTIFY.

SQLite has no notifications: a process alone on its file learns of other
writers by polling the file's data version, which makes a watcher whose job
runs in another process up to a poll late. Siblings know each other, so each
one listens on a Unix socket in a private directory their supervisor made
(`<slot>.sock`), and after every commit that made work or events, sends each
sibling one line: whether work became claimable, and the committed events
themselves, numbered as the feed numbers them. The receiver publishes them on
its change hub as if it had committed them, so its watchers deliver them from
memory, as they do their own process's (each watcher still checks that its
sequence or position continues, and reads the database when it does not). A
batch whose events are too large to carry sends only which jobs and feeds grew;
their watchers read those from the database.

Nothing here is the truth: the events are in the file. So a sibling that cannot
take a line (not up yet, restarting, or so far behind that its unread backlog
passed `MAX_BACKLOG_BYTES`) is not waited for: it is marked as having missed
some, and the first line it gets on the next connection, or once it has caught
up, says "read everything once". Nothing it should hear of is lost, and a slow
sibling never slows the writer down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from leasehold._server.jobs.notifications import ChangeHub, feed_key
from leasehold._server.jobs.records import FeedEvent, JobEvent, JobSubject

log = structlog.get_logger("leasehold.storage")

# Past this much unsent to one sibling, the rest is dropped for one "read everything".
MAX_BACKLOG_BYTES = 4 << 20
# A batch's events travel themselves up to this size; past it, only which jobs and feeds grew.
MAX_EVENTS_BYTES = 256 * 1024
# A line longer than this is not ours (the fallback names at most a batch's jobs).
MAX_LINE_BYTES = 4 << 20
READ_EVERYTHING = b'{"u":1}\n'
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


def encode(work: bool, events: list[FeedEvent]) -> bytes:
    """One batch's line: the events themselves, or past MAX_EVENTS_BYTES which
    jobs and feeds grew."""
    line = json.dumps(
        {
            "w": int(work),
            "e": [
                [
                    item.event.job_id,
                    item.event.sequence,
                    item.event.type,
                    item.event.payload,
                    item.event.created_at.isoformat(),
                    item.position,
                    *item.subject,
                ]
                for item in events
            ],
        },
        separators=(",", ":"),
    ).encode()
    if len(line) > MAX_EVENTS_BYTES:
        grew = {
            "w": int(work),
            "j": list(dict.fromkeys(item.event.job_id for item in events)),
            "f": list(dict.fromkeys(feed_key(item.subject.owner_id) for item in events)),
        }
        line = json.dumps(grew, separators=(",", ":")).encode()
    return line + b"\n"


def publish(line: bytes, changes: ChangeHub) -> None:
    """A sibling's line, published on this process's hub; ValueError if it is not ours."""
    message: dict[str, Any] = json.loads(line)
    if message.get("u"):
        changes.publish_unknown_changes()
        return
    if message["w"]:
        changes.publish_work()
    if "e" in message:
        changes.publish_events(
            FeedEvent(
                JobEvent(job_id, sequence, kind_of_event, payload, datetime.fromisoformat(created_at)),
                position,
                JobSubject(owner_id, kind, resource_type, resource_id),
            )
            for (
                job_id,
                sequence,
                kind_of_event,
                payload,
                created_at,
                position,
                owner_id,
                kind,
                resource_type,
                resource_id,
            ) in message["e"]
        )
        return
    changes.publish_job_changes(message["j"])
    changes.publish_feed_changes(message["f"])


class SiblingBus:
    """Sends this process's commits to its siblings (`tell`, called after each
    commit) and publishes theirs on `changes` (`run`, until cancelled)."""

    def __init__(self, group: SiblingGroup, changes: ChangeHub) -> None:
        self._group = group
        self._changes = changes
        self._peers = {slot: _Peer(group.socket_of(slot)) for slot in group.others}
        self.listening = asyncio.Event()

    def tell(self, work: bool, events: list[FeedEvent]) -> None:
        """On the event loop, after the commit: never waits for anyone. The line
        is encoded once for every sibling."""
        if (work or events) and self._peers:
            line = encode(work, events)
            for peer in self._peers.values():
                peer.send(line)

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
                os.unlink(path)

    async def _serve_sibling(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    publish(line, self._changes)
                except (ValueError, KeyError, TypeError):
                    log.warning("storage.sibling_line_ignored", reason="not a leasehold line")
                    self._changes.publish_unknown_changes()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass  # the sibling went away, or sent a line past the limit: its next connection starts afresh
        finally:
            writer.close()


class _Peer:
    """One sibling's end: a connection made on demand and made again after any
    failure, lines written without waiting, and whether it may have missed some."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._missed = True  # a new connection starts with "read everything"
        self._closed = False

    def send(self, line: bytes) -> None:
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
            writer.write(READ_EVERYTHING)
            self._missed = False
        writer.write(line)

    async def _catch_up(self, writer: asyncio.StreamWriter) -> None:
        """Once the backlog it could not take is sent, "read everything", even
        if nothing more is committed after the lines it lost."""
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        if self._missed and self._writer is writer and not writer.is_closing():
            writer.write(READ_EVERYTHING)
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
            writer.write(READ_EVERYTHING)  # whatever it may have missed meanwhile
            self._missed = False
            self._writer = writer
            return

    def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._writer is not None:
            self._writer.close()

"""Changes across replicas on PostgreSQL: NOTIFY when a batch commits, LISTEN on
one connection per process.

Each writer batch that made work claimable or appended events sends, inside its
own transaction, one notification naming its origin (the process), whether it
made work, and the ids of the jobs whose logs grew. PostgreSQL delivers it to
every listening session when, and only when, that transaction commits. The
listener of every other replica then wakes its idle workers and tells the
subscribers of those jobs to read the log: the events themselves stay in the
database, which is what a notification's 8,000-byte limit and a subscriber's
gap-free guarantee both want.

A session that is not listening misses notifications for good. So whenever the
listener (re)connects, it first LISTENs and then announces unknown changes:
every idle worker looks for work and every subscriber reads its log once, which
covers whatever was committed while it was away.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import structlog
from psycopg import sql

from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.sql.writer import Announce

log = structlog.get_logger("leasehold.storage")

CHANNEL = "leasehold_changes"
# PostgreSQL refuses a payload of 8,000 bytes or more; job ids are ASCII.
MAX_PAYLOAD_BYTES = 7_900
_FIELD = ";"
_ID = ","

RECONNECT_FIRST_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 2.0


def new_origin() -> str:
    """A name for this process's notifications, so it can skip its own."""
    return uuid.uuid4().hex[:16]


def payloads(origin: str, work: bool, job_ids: list[str]) -> Iterator[str]:
    """The notifications for one batch: as few as fit the size limit; the first
    carries the work flag."""
    head = f"{origin}{_FIELD}{int(work)}{_FIELD}"
    chunk: list[str] = []
    size = len(head)
    for job_id in job_ids:
        if chunk and size + len(job_id) + 1 > MAX_PAYLOAD_BYTES:
            yield head + _ID.join(chunk)
            head = f"{origin}{_FIELD}0{_FIELD}"
            chunk, size = [], len(head)
        chunk.append(job_id)
        size += len(job_id) + 1
    if chunk or work:
        yield head + _ID.join(chunk)


def parse(payload: str) -> tuple[str, bool, list[str]] | None:
    """(origin, work, job ids), or None for a payload that is not ours."""
    parts = payload.split(_FIELD)
    if len(parts) != 3 or parts[1] not in ("0", "1"):
        return None
    origin, work, ids = parts
    return origin, work == "1", [job_id for job_id in ids.split(_ID) if job_id]


def notifier(origin: str) -> Announce:
    """The writer's `announce` hook: the NOTIFYs of a batch, sent with its COMMIT
    (one round trip fewer per batch; the values are quoted as literals)."""

    def announce(work: bool, job_ids: list[str]) -> str:
        return "".join(
            sql.SQL("NOTIFY {}, {};").format(sql.Identifier(CHANNEL), sql.Literal(payload)).as_string(None)
            for payload in payloads(origin, work, job_ids)
        )

    return announce


class ChangeListener:
    """LISTENs on its own connection (outside the pool, which it would otherwise
    hold forever) and republishes other replicas' changes on `changes`."""

    def __init__(self, connect_args: dict[str, Any], changes: ChangeHub, origin: str) -> None:
        self._connect_args = connect_args
        self._changes = changes
        self._origin = origin
        self.listening = asyncio.Event()

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after any failure."""
        delay = RECONNECT_FIRST_SECONDS
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(**self._connect_args) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    delay = RECONNECT_FIRST_SECONDS
                    self._changes.publish_unknown_changes()
                    async for notification in conn.notifies():
                        self._deliver(notification.payload)
            except psycopg.Error as exc:
                log.warning("storage.listen_failed", error=str(exc).strip(), retry_in_seconds=delay)
            except Exception as exc:  # a bug: keep listening, loudly
                log.error("storage.listen_failed", error_class=type(exc).__name__, exc_info=exc)
            self.listening.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_SECONDS)

    def _deliver(self, payload: str) -> None:
        parsed = parse(payload)
        if parsed is None:
            log.warning("storage.notification_ignored", reason="not a leasehold payload")
            return
        origin, work, job_ids = parsed
        if origin == self._origin:
            return  # this process announced its own commits already
        if work:
            self._changes.publish_work()
        if job_ids:
            self._changes.publish_job_changes(job_ids)

"""The sibling bus of `serve --processes`: what one process commits reaches its
siblings' change hubs over real Unix sockets, as the events themselves, and a
sibling that could not take a line is told to read everything rather than left
unaware."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from leasehold._server.jobs import sibling_bus
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.records import FeedEvent, JobEvent, JobSubject
from leasehold._server.jobs.sibling_bus import READ_EVERYTHING, SiblingBus, SiblingGroup

BOUND = 10.0


async def until(condition: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(BOUND):
        while not condition():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(bus: SiblingBus) -> AsyncIterator[SiblingBus]:
    task = asyncio.create_task(bus.run())
    try:
        async with asyncio.timeout(BOUND):
            await bus.listening.wait()
        yield bus
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pair(directory: Path) -> tuple[SiblingBus, ChangeHub, SiblingBus, ChangeHub]:
    hubs = ChangeHub(), ChangeHub()
    a = SiblingBus(SiblingGroup(str(directory), 0, 2), hubs[0])
    b = SiblingBus(SiblingGroup(str(directory), 1, 2), hubs[1])
    return a, hubs[0], b, hubs[1]


def numbered(job_id: str, sequence: int, position: int, payload: dict[str, Any] | None = None) -> FeedEvent:
    event = JobEvent(job_id, sequence, "progress", payload or {"step": sequence}, datetime.now(UTC))
    return FeedEvent(event, position, JobSubject("alice", "media.resize", "photo", "p1"))


async def test_a_commit_reaches_the_sibling_that_watches_it_with_its_events(tmp_path: Path) -> None:
    a, _, b, b_hub = pair(tmp_path)
    async with running(a), running(b):
        with (
            b_hub.watch_job("job_1") as watched,
            b_hub.watch_job("job_2") as other,
            b_hub.watch_feed("alice") as feed,
            b_hub.watch_work() as work,
        ):
            a.tell(False, [])  # nothing to say: nothing sent, no connection made yet
            a.tell(False, [numbered("job_1", 1, 1)])
            # That one was lost while connecting, so the first line on the new
            # connection is "read everything".
            await until(lambda: not watched.take()[1], "job_1 to be marked")
            work.clear()
            other.take()
            feed.take()

            sent = [numbered("job_1", 2, 2), numbered("job_1", 3, 3)]
            a.tell(False, sent)
            await until(lambda: bool(watched._items), "job_1's events")
            # The events themselves, equal to what was committed: no read of the log needed.
            assert watched.take() == ([item.event for item in sent], True)
            assert feed.take() == (sent, True)
            assert other.take() == ([], True)  # not every job: only the one named
            assert not work.is_set()

            a.tell(True, [])
            await until(work.is_set, "the work signal")


async def test_events_too_large_to_carry_name_their_jobs_and_feeds_instead(tmp_path: Path) -> None:
    a, _, b, b_hub = pair(tmp_path)
    async with running(a), running(b):
        with b_hub.watch_job("job_1") as watched, b_hub.watch_feed("alice") as feed:
            a.tell(False, [numbered("job_1", 1, 1)])  # connects; "read everything" arrives
            await until(lambda: not watched.take()[1], "the connection's first line")
            feed.take()

            big = {"blob": "x" * (sibling_bus.MAX_EVENTS_BYTES + 1)}
            a.tell(False, [numbered("job_1", 2, 2, big)])
            await until(lambda: not watched.take()[1], "job_1 to be marked")
            assert feed.take() == ([], False)  # its subscribers read the feed


async def test_a_sibling_not_listening_yet_hears_everything_once_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sibling_bus, "RECONNECT_MAX_SECONDS", 0.05)
    a, _, b, b_hub = pair(tmp_path)
    async with running(a):
        a.tell(False, [numbered("job_1", 1, 1)])  # b is not there: lost, and remembered as lost
        await asyncio.sleep(0.1)
        with b_hub.watch_job("job_9") as unrelated:
            async with running(b):
                # Not about job_9 at all, yet it must read: it may have missed anything.
                await until(lambda: not unrelated.take()[1], "the read-everything line")


async def test_a_sibling_too_far_behind_loses_lines_but_is_told_to_read_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver that stops reading: the sender's backlog stops at the bound, and
    once the receiver reads again, the last line it gets says "read everything"."""
    monkeypatch.setattr(sibling_bus, "MAX_BACKLOG_BYTES", 64 * 1024)
    group = SiblingGroup(str(tmp_path), 0, 2)
    reading = asyncio.Event()
    lines: list[bytes] = []

    async def stalled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reading.wait()
        while line := await reader.readline():
            lines.append(line)

    server = await asyncio.start_unix_server(stalled, path=group.socket_of(1), limit=1 << 20)
    async with server:
        a = SiblingBus(group, ChangeHub())
        async with running(a):
            events = [numbered(f"job_{index:060x}", 1, index) for index in range(100)]
            a.tell(False, events)  # connects
            await asyncio.sleep(0.1)
            told = 0
            while told < 2_000:  # far past what the socket and the backlog hold
                a.tell(False, events)
                told += 1
                await asyncio.sleep(0)
            reading.set()

            await until(lambda: bool(lines) and lines[-1] == READ_EVERYTHING, "the last line")

    sent_in_full = sum(1 for line in lines if line != READ_EVERYTHING)
    assert sent_in_full < told  # some were dropped, not queued without end
    assert lines[0] == READ_EVERYTHING  # the connection's first line

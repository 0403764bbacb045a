"""The sibling bus of `serve --processes`: what one process commits reaches its
siblings' change hubs over real Unix sockets, and a sibling that could not take
an announcement is told to read everything rather than left unaware."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from leasehold._server.jobs import sibling_bus
from leasehold._server.jobs.announcements import parse
from leasehold._server.jobs.notifications import ChangeHub, feed_key
from leasehold._server.jobs.sibling_bus import SiblingBus, SiblingGroup

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
    a = SiblingBus(SiblingGroup(str(directory), 0, 2), hubs[0], "origin-a")
    b = SiblingBus(SiblingGroup(str(directory), 1, 2), hubs[1], "origin-b")
    return a, hubs[0], b, hubs[1]


async def test_a_commit_reaches_the_sibling_that_watches_it(tmp_path: Path) -> None:
    a, _, b, b_hub = pair(tmp_path)
    async with running(a), running(b):
        with (
            b_hub.watch_job("job_1") as watched,
            b_hub.watch_job("job_2") as other,
            b_hub.watch_work() as work,
        ):
            a.tell(False, [], [])  # nothing to say: nothing sent, no connection made yet
            a.tell(False, ["job_1"], [feed_key("alice")])
            # The first line on a new connection is "read everything" (it may have
            # missed what came before); then the job's own.
            await until(lambda: not watched.take()[1], "job_1 to be marked")
            work.clear()
            other.take()
            a.tell(False, ["job_1"], [])
            await until(lambda: not watched.take()[1], "job_1 to be marked again")
            assert other.take() == ([], True)  # not every job: only the one named
            assert not work.is_set()

            a.tell(True, [], [])
            await until(work.is_set, "the work signal")


async def test_a_sibling_not_listening_yet_hears_everything_once_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sibling_bus, "RECONNECT_MAX_SECONDS", 0.05)
    a, _, b, b_hub = pair(tmp_path)
    async with running(a):
        a.tell(False, ["job_1"], [])  # b is not there: lost, and remembered as lost
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
        a = SiblingBus(group, ChangeHub(), "origin-a")
        async with running(a):
            job_ids = [f"job_{index:060x}" for index in range(100)]
            a.tell(False, job_ids, [])  # connects
            await asyncio.sleep(0.1)
            told = 0
            while told < 2_000:  # far past what the socket and the backlog hold
                a.tell(False, job_ids, [])
                told += 1
                await asyncio.sleep(0)
            reading.set()

            def last_says_read_everything() -> bool:
                last = parse(lines[-1].decode().rstrip("\n")) if lines else None
                return last is not None and last.unknown

            await until(last_says_read_everything, "the last line")

    announcements = [parse(line.decode().rstrip("\n")) for line in lines]
    assert all(item is not None for item in announcements)
    sent_in_full = sum(1 for item in announcements if item is not None and not item.unknown)
    assert sent_in_full < told  # some were dropped, not queued without end
    assert announcements[0] is not None and announcements[0].unknown  # the connection's first line

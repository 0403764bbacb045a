"""Experiment 6 — WatchEvents resumes without loss or duplicate (DESIGN §2, §4).

Promise: a subscriber that keeps the last sequence it saw and reconnects with
`after_sequence` set to it never sees a gap or a duplicate, whatever broke the
stream, and the stream ends OK after the job's terminal event (docs/jobs.md, "Events and progress": "A watch
that breaks (network, server restart) loses nothing").

How it could fail: a replay that starts at `after_sequence` instead of after it
duplicates; one that reads live events from a notification rather than from the
log skips what committed while nobody listened; a server going down could end a
stream with OK before the terminal event, which a client would take for "done".

How: a real `leasehold serve` subprocess works through `stream.ticker` jobs
(tests/reliability/stream_handlers.py: 60 events, one every 50 ms) while four
client lanes follow them. Each stream is cut at a seeded random point — after a
random number of events or a random time, mid-replay or mid-live — by the client
cancelling it, and the server is restarted on the same database several times, with
SIGINT (graceful: open streams are cut, running attempts handed back) and with
SIGKILL (a crash: streams die with the process, attempts come back through their
expired leases). A subprocess rather than an in-process app, because only a real
process dying breaks the connection the way a crash does and only SIGKILL skips
every cleanup path. After each break the lane resumes with the last sequence it
saw. Every job's union of received events must be exactly 1..N with nothing
received twice, equal to the log in the database, and the last stream must end
OK after the terminal event.

Both engines. On PostgreSQL a restarted server also reconnects its change
listener, and what committed while no listener was connected must still reach
the resumed streams (they read the log, not the notifications).
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests import database_reads
from tests.api.helpers import struct
from tests.reliability.conftest import Figures
from tests.reliability.stream_handlers import TICK_EVENT, TICKER
from tests.support import owner_metadata
from tests.system.helpers import Leasehold

pytestmark = pytest.mark.slow

SEED = 6
LANES = 4
CANCEL_BREAKS = 80  # client cuts wanted at least; the lanes cut on until, with the
TOTAL_BREAKS = 100  # restarts' breaks, there are this many
RESTARTS = ("SIGINT", "SIGKILL", "SIGINT", "SIGINT", "SIGKILL", "SIGINT")
RESTART_GAP_SECONDS = (1.5, 3.5)  # seeded pause between restarts
TICKER_PAYLOAD = {"events": 60, "pause": 0.05}
MAX_ATTEMPTS = 20  # each SIGKILL costs a running job an attempt
STREAM_TIMEOUT_SECONDS = 60.0
SERVER_FLAGS = (
    "--concurrency",
    "8",
    "--lease-seconds",
    "6",
    "--poll-seconds",
    "0.05",
    "--handlers",
    "leasehold.examples",
    "tests.reliability.stream_handlers",
)
TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled"})

# (type, payload) of one event.
Entry = tuple[str, dict[str, Any]]


class Server:
    """The current `leasehold serve` on the shared database, and its restarts. Each
    start is a new generation with its own port; a stream that fails while a
    restart is under way (or on an older generation) was broken by that restart."""

    def __init__(self, database_url: str, track: Callable[[Leasehold], Leasehold]) -> None:
        self.database_url = database_url
        self.track = track
        self.process: Leasehold | None = None
        self.port = 0
        self.generation = 0
        self.restarting = False
        self.ended_by: dict[int, str] = {}  # generation -> how it was stopped
        self.exit_codes: list[int | None] = []

    async def start(self) -> None:
        process = self.track(Leasehold.serve(self.database_url, *SERVER_FLAGS))
        self.port = await asyncio.to_thread(process.start)
        self.process = process
        self.generation += 1
        self.restarting = False

    async def stop(self, how: str) -> None:
        assert self.process is not None
        self.restarting = True
        self.ended_by[self.generation] = how
        if how == "SIGKILL":
            await asyncio.to_thread(self.process.kill)
        else:
            await asyncio.to_thread(self.process.interrupt, 10.0, signal.SIGINT)
        self.exit_codes.append(self.process.returncode)

    async def restart(self, how: str) -> None:
        await self.stop(how)
        await self.start()

    async def wait_newer_than(self, generation: int) -> None:
        """Wait until a server newer than `generation` is up (a short poll on a
        local flag; the start itself is awaited by the restarter)."""
        async with asyncio.timeout(60):
            while self.restarting or self.generation <= generation:
                await asyncio.sleep(0.02)

    def broke(self, generation: int) -> str | None:
        """The restart that explains a failure seen on `generation`, if any."""
        if self.generation > generation:
            return self.ended_by.get(generation)
        if self.restarting:
            return self.ended_by.get(self.generation)
        return None


@dataclass
class Tally:
    breaks: Counter[str] = field(default_factory=Counter)
    restart_codes: Counter[str] = field(default_factory=Counter)
    streams: int = 0
    unexpected: list[str] = field(default_factory=list)
    restarts_over: bool = False

    @property
    def cancels(self) -> int:
        return self.breaks["cancel after events"] + self.breaks["cancel after time"]

    @property
    def enough(self) -> bool:
        """The cuts wanted, every restart made, and a hundred breaks in all (how many
        streams a restart breaks depends on how many were open at the time)."""
        total = sum(self.breaks.values())
        return self.cancels >= CANCEL_BREAKS and self.restarts_over and total >= TOTAL_BREAKS


@dataclass
class Followed:
    """One job as a lane saw it across all its streams."""

    job_id: str
    received: dict[int, Entry] = field(default_factory=dict)
    duplicates: list[int] = field(default_factory=list)
    out_of_order: list[tuple[int, int]] = field(default_factory=list)
    streams: int = 0
    ended_ok_after_terminal: bool = False
    terminal_sequence: int = 0


class Lane:
    """A client that enqueues a job, follows it to the end through every break,
    and then takes the next one."""

    def __init__(self, number: int, server: Server, tally: Tally, stop_cutting: asyncio.Event) -> None:
        self.number = number
        self.server = server
        self.tally = tally
        self.stop_cutting = stop_cutting
        self.random = random.Random(SEED * 1000 + number)
        self.followed: list[Followed] = []
        self._channel: grpc.aio.Channel | None = None
        self._generation = 0

    async def stub(self) -> tuple[jobs_pb2_grpc.JobServiceStub, int]:
        await self.server.wait_newer_than(self._generation - 1)
        if self._generation != self.server.generation or self._channel is None:
            if self._channel is not None:
                await self._channel.close()
            self._generation = self.server.generation
            self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.server.port}")
        return jobs_pb2_grpc.JobServiceStub(self._channel), self._generation

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def run(self, done: asyncio.Event) -> None:
        count = 0
        while not done.is_set():
            count += 1
            job_id = await self.enqueue(f"lane{self.number}-job{count}")
            followed = Followed(job_id)
            self.followed.append(followed)
            await self.follow(followed)

    async def enqueue(self, resource_id: str) -> str:
        """Enqueue, retrying across restarts; the resource id makes a retry after
        an unanswered attempt return the same job instead of a second one."""
        request = jobs_pb2.EnqueueRequest(
            kind=TICKER,
            payload=struct(TICKER_PAYLOAD),
            resource_type="watch-resume",
            resource_id=resource_id,
            max_attempts=MAX_ATTEMPTS,
        )
        while True:
            stub, generation = await self.stub()
            try:
                response = await stub.Enqueue(request, metadata=owner_metadata(), timeout=20)
                return response.job.id
            except grpc.aio.AioRpcError:
                if self.server.broke(generation) is None:
                    raise
                await self.server.wait_newer_than(generation)

    def plan_cut(self) -> tuple[str, float] | None:
        """Where to cut the next stream: after a number of events, after a time,
        or not at all."""
        if self.stop_cutting.is_set():
            return None
        roll = self.random.random()
        if roll < 0.45:
            return "cancel after events", float(self.random.randint(1, 30))
        if roll < 0.9:
            return "cancel after time", self.random.uniform(0.02, 1.0)
        return None

    async def follow(self, followed: Followed) -> None:
        last = 0
        while True:
            stub, generation = await self.stub()
            cut = self.plan_cut()
            followed.streams += 1
            self.tally.streams += 1
            call = stub.WatchEvents(
                jobs_pb2.WatchEventsRequest(job_id=followed.job_id, after_sequence=last),
                metadata=owner_metadata(),
                timeout=STREAM_TIMEOUT_SECONDS,
            )
            loop = asyncio.get_running_loop()
            cut_at = loop.time() + cut[1] if cut and cut[0] == "cancel after time" else None
            in_stream = 0
            try:
                while True:
                    terminal_seen = followed.terminal_sequence > 0
                    if cut_at is not None and not terminal_seen:
                        remaining = cut_at - loop.time()
                        try:
                            async with asyncio.timeout(max(remaining, 0)):
                                response = await call.read()
                        except TimeoutError:
                            call.cancel()
                            self.tally.breaks["cancel after time"] += 1
                            break
                    else:
                        response = await call.read()
                    if response is grpc.aio.EOF:
                        code = await call.code()
                        if code == grpc.StatusCode.OK and terminal_seen:
                            followed.ended_ok_after_terminal = True
                            return
                        self.tally.unexpected.append(
                            f"{followed.job_id}: stream ended {code.name} after sequence {last} "
                            f"without the terminal event"
                        )
                        return
                    event = response.event
                    if terminal_seen:
                        self.tally.unexpected.append(
                            f"{followed.job_id}: event {event.sequence} after the terminal event"
                        )
                    if event.sequence in followed.received:
                        followed.duplicates.append(event.sequence)
                    if event.sequence != last + 1:
                        followed.out_of_order.append((last, event.sequence))
                    followed.received[event.sequence] = (
                        event.type,
                        json_format.MessageToDict(event.payload),
                    )
                    last = max(last, event.sequence)
                    in_stream += 1
                    if event.type in TERMINAL_EVENTS:
                        followed.terminal_sequence = event.sequence
                    elif cut is not None and cut[0] == "cancel after events" and in_stream >= cut[1]:
                        call.cancel()
                        self.tally.breaks["cancel after events"] += 1
                        break
            except grpc.aio.AioRpcError as err:
                how = self.server.broke(generation)
                if how is None:
                    self.tally.unexpected.append(f"{followed.job_id}: stream failed {err.code().name}")
                    raise
                self.tally.breaks[f"restart {how}"] += 1
                self.tally.restart_codes[err.code().name] += 1
                await self.server.wait_newer_than(generation)
            finally:
                call.cancel()
            if self.tally.enough:
                self.stop_cutting.set()


def stored_log(database_url: str, job_id: str) -> dict[int, Entry]:
    found = database_reads.rows(
        database_url,
        "SELECT sequence, type, payload FROM job_events WHERE job_id = :job_id ORDER BY sequence",
        job_id=job_id,
    )
    return {row["sequence"]: (row["type"], database_reads.json_column(row["payload"])) for row in found}


@pytest.mark.timeout(120)
async def test_watch_streams_broken_a_hundred_times_resume_without_gap_or_duplicate(
    database_url: str, processes: Callable[[Leasehold], Leasehold], figures: Figures
) -> None:
    server = Server(database_url, processes)
    await server.start()
    tally = Tally()
    stop_cutting = asyncio.Event()
    done = asyncio.Event()
    lanes = [Lane(number, server, tally, stop_cutting) for number in range(LANES)]
    restarter_random = random.Random(SEED)

    async def restarter() -> None:
        for how in RESTARTS:
            await asyncio.sleep(restarter_random.uniform(*RESTART_GAP_SECONDS))
            await server.restart(how)
        tally.restarts_over = True
        # Once there are enough breaks, every lane finishes the job it is following.
        async with asyncio.timeout(60):
            while not stop_cutting.is_set():
                await asyncio.sleep(0.05)
        done.set()

    try:
        async with asyncio.timeout(110):
            await asyncio.gather(restarter(), *(lane.run(done) for lane in lanes))
    finally:
        for lane in lanes:
            await lane.close()
    await server.stop("SIGINT")

    assert tally.unexpected == []
    assert server.exit_codes == [0 if how == "SIGINT" else -signal.SIGKILL for how in (*RESTARTS, "SIGINT")]
    followed = [job for lane in lanes for job in lane.followed]
    events_checked = 0
    for job in followed:
        assert not job.duplicates, f"{job.job_id}: received twice: {job.duplicates[:20]}"
        assert not job.out_of_order, f"{job.job_id}: out of order (last, got): {job.out_of_order[:20]}"
        assert job.terminal_sequence > 0 and job.ended_ok_after_terminal, job.job_id
        assert sorted(job.received) == list(range(1, job.terminal_sequence + 1)), job.job_id
        assert job.received[job.terminal_sequence][0] == "job.succeeded"
        assert job.received == stored_log(database_url, job.job_id), job.job_id
        ticks = sum(kind == TICK_EVENT for kind, _ in job.received.values())
        assert ticks >= TICKER_PAYLOAD["events"], job.job_id
        events_checked += len(job.received)

    restart_breaks = sum(n for kind, n in tally.breaks.items() if kind.startswith("restart"))
    assert tally.cancels >= CANCEL_BREAKS
    assert restart_breaks >= len(RESTARTS), tally.breaks  # every restart broke a stream
    assert tally.cancels + restart_breaks >= TOTAL_BREAKS
    figures("breaks total", tally.cancels + restart_breaks)
    for kind, count in sorted(tally.breaks.items()):
        figures(f"breaks: {kind}", count)
    figures("restarts SIGINT/SIGKILL", f"{RESTARTS.count('SIGINT')}/{RESTARTS.count('SIGKILL')}")
    figures("codes of restart breaks", dict(tally.restart_codes))
    figures("streams opened", tally.streams)
    figures("jobs", len(followed))
    figures("events checked", events_checked)
    figures("max attempts of a job", max(_attempts(job) for job in followed))


def _attempts(job: Followed) -> int:
    return max(
        (int(payload.get("attempt", 0)) for kind, payload in job.received.values() if kind == "job.started"),
        default=0,
    )

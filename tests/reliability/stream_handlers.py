"""Job kinds that produce event streams, for the event-sequence and watch-resume
experiments (tests/reliability/test_event_sequences.py, test_watch_resume.py).

In process, build a `StreamHandlers`, register it into the app's registry and read
what the handlers observed (every acknowledged append with its sequence and the
monotonic times it was issued and acknowledged). In a `leasehold serve` subprocess,
load `--handlers tests.reliability.stream_handlers`; the observations then stay in
that process, unused.

Kinds:

`stream.fanout` `{"appenders": A, "per_appender": K, "pause": s, "wait_go": bool}`:
    A concurrent tasks each append K events of type `fan` with payload
    `{"id": "<a>:<i>", "appender": a, "index": i}`, in order i = 0..K-1, sleeping `s`
    seconds (default 0) between appends. With `wait_go`, the appenders wait until the
    test calls `release(job_id)` (so a watcher can subscribe first). An append that
    fails with `StorageUnavailable` is retried, as a client of a retryable error
    should; an event id that was acknowledged once is never appended again, not even
    by a later attempt of the job, so the handler is idempotent per logical event.

`stream.ticker` `{"events": n, "pause": s}`:
    appends `tick` events `{"i": i, "attempt": attempt}` for i = 1..n with a pause
    of `s` seconds before each, so a watcher sees a job producing events live. A
    later attempt starts again from 1 (its events are new log entries, as at-least-
    once delivery makes them).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field

from leasehold._server.jobs.errors import StorageUnavailable
from leasehold._server.jobs.records import JobEvent, JsonObject
from leasehold.worker import HandlerRegistry, JobContext

FANOUT = "stream.fanout"
TICKER = "stream.ticker"
FAN_EVENT = "fan"
TICK_EVENT = "tick"

# How often one append is retried on StorageUnavailable before the handler gives up
# (at an injected fault rate of 0.05, 40 failures in a row never happen).
MAX_APPEND_TRIES = 40
RETRY_PAUSE_SECONDS = 0.005


@dataclass(frozen=True)
class Ack:
    """One acknowledged append, as its appender saw it."""

    job_id: str
    attempt: int
    appender: int
    index: int
    event_id: str
    sequence: int
    issued: float  # time.monotonic() when the (first try of the) append was issued
    acked: float  # time.monotonic() when it was acknowledged


@dataclass
class StreamHandlers:
    """The kinds above, with what they observed."""

    acks: defaultdict[str, list[Ack]] = field(default_factory=lambda: defaultdict(list))
    retried_appends: int = 0
    attempts: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    _go: dict[str, asyncio.Event] = field(default_factory=dict)
    _acked_ids: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def register(self, registry: HandlerRegistry) -> None:
        registry.register(FANOUT, self.fanout)
        registry.register(TICKER, self.ticker)

    def release(self, job_id: str) -> None:
        """Let the `wait_go` appenders of `job_id` start."""
        self._gate(job_id).set()

    def _gate(self, job_id: str) -> asyncio.Event:
        return self._go.setdefault(job_id, asyncio.Event())

    async def append(self, ctx: JobContext, event_type: str, payload: JsonObject) -> JobEvent:
        """`ctx.append_event`, retried while storage is unavailable. A failed commit
        leaves nothing behind, so a retry cannot write the event twice."""
        for _ in range(MAX_APPEND_TRIES - 1):
            try:
                return await ctx.append_event(event_type, payload)
            except StorageUnavailable:
                self.retried_appends += 1
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
        return await ctx.append_event(event_type, payload)

    async def fanout(self, ctx: JobContext) -> None:
        self.attempts[ctx.job_id] += 1
        appenders = int(ctx.payload.get("appenders", 20))
        per_appender = int(ctx.payload.get("per_appender", 25))
        pause = float(ctx.payload.get("pause", 0))
        if ctx.payload.get("wait_go"):
            await self._gate(ctx.job_id).wait()

        async def appender(number: int) -> None:
            for index in range(per_appender):
                event_id = f"{number}:{index}"
                if event_id in self._acked_ids[ctx.job_id]:
                    continue  # written by an earlier attempt: idempotent
                issued = time.monotonic()
                event = await self.append(
                    ctx, FAN_EVENT, {"id": event_id, "appender": number, "index": index}
                )
                acked = time.monotonic()
                self._acked_ids[ctx.job_id].add(event_id)
                self.acks[ctx.job_id].append(
                    Ack(ctx.job_id, ctx.attempt, number, index, event_id, event.sequence, issued, acked)
                )
                if pause:
                    await asyncio.sleep(pause)

        async with asyncio.TaskGroup() as group:
            for number in range(appenders):
                group.create_task(appender(number))

    async def ticker(self, ctx: JobContext) -> None:
        self.attempts[ctx.job_id] += 1
        count = int(ctx.payload.get("events", 50))
        pause = float(ctx.payload.get("pause", 0.02))
        for i in range(1, count + 1):
            await asyncio.sleep(pause)
            await self.append(ctx, TICK_EVENT, {"i": i, "attempt": ctx.attempt})


def register(registry: HandlerRegistry) -> None:
    """`--handlers tests.reliability.stream_handlers`."""
    StreamHandlers().register(registry)

"""Reads asked in the same turn of the event loop, answered by one statement.

Handlers that reach a safe point together (every job woken by the same commit,
say, checking for a cancel right after its append) would each take a pooled
connection and a thread hop for a one-row read. Coalesced, they cost one
statement and one hop however many asked. Nothing waits on a timer: the batch
is sent on the loop's next turn, once everyone already running has asked.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Key = TypeVar("Key")
Answer = TypeVar("Answer")

# Keys per statement: far below SQLite's limit on bound parameters.
CHUNK = 500


class ReadBatcher(Generic[Key, Answer]):
    """`read_many(keys)` answers every key, in order, with its answer or the
    exception that caller should see; an exception it raises reaches every
    caller of that batch."""

    def __init__(self, read_many: Callable[[Sequence[Key]], Awaitable[list[Answer | Exception]]]) -> None:
        self._read_many = read_many
        self._pending: list[tuple[Key, asyncio.Future[Answer]]] = []
        self._running: set[asyncio.Task[None]] = set()

    async def ask(self, key: Key) -> Answer:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        if not self._pending:
            # A batch answers many calls: it runs in none's log context.
            loop.call_soon(self._send, context=contextvars.Context())
        self._pending.append((key, future))
        return await future

    def _send(self) -> None:
        batch, self._pending = self._pending, []
        for start in range(0, len(batch), CHUNK):
            task = asyncio.ensure_future(self._answer(batch[start : start + CHUNK]))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _answer(self, batch: list[tuple[Key, asyncio.Future[Answer]]]) -> None:
        try:
            answers = await self._read_many([key for key, _ in batch])
        except Exception as exc:
            for _, future in batch:
                if not future.done():  # a caller that went away was cancelled
                    future.set_exception(exc)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if future.done():
                continue
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)

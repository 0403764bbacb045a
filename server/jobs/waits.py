"""Waiting for an answer that may never be needed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def first_of(answer: Awaitable[T], give_up: asyncio.Event, timeout: float) -> T | None:
    """`answer`'s value if it comes before `give_up` is set and before `timeout`
    seconds pass; None otherwise, with `answer` cancelled (so pass a shielded
    one if what it waits for must go on)."""
    answering = asyncio.ensure_future(answer)
    stopping = asyncio.ensure_future(give_up.wait())
    try:
        await asyncio.wait({answering, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not answering.done():
            answering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answering
    if answering.cancelled():
        return None
    return answering.result()

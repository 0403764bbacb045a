"""Task helpers shared by the runtime's roles."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it to end, without swallowing a cancel aimed at
    the caller itself."""
    current = asyncio.current_task()
    cancels_before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > cancels_before:
            raise

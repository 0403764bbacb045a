"""A job kind for the planted-secrets test, loaded with `--handlers
tests.auth.secret_handlers`: it returns a result holding a string that appears
nowhere in its payload, so the test can look for each of them separately."""

from __future__ import annotations

from typing import Any

from leasehold.worker import HandlerRegistry, JobContext

RESULT_PLANT = "result-PLANTED-never-to-be-logged-5e1d"


async def answer(ctx: JobContext) -> dict[str, Any]:
    await ctx.append_event("seen", {"size": len(str(ctx.payload))})
    return {"answer": RESULT_PLANT}


def register(registry: HandlerRegistry) -> None:
    registry.register("test.answer", answer)

"""Built-in example kinds, for trying the service and for its tests."""

from __future__ import annotations

import asyncio

from leasehold.worker import HandlerRegistry, JobContext, PermanentError, private_message


async def echo(ctx: JobContext) -> None:
    """Append one `echo` event whose payload is the job's payload."""
    await ctx.append_event("echo", dict(ctx.payload))


async def sleep(ctx: JobContext) -> None:
    """`{"seconds": s, "steps": n}`: sleep s seconds in n steps, reporting progress
    after each step and stopping at the first step after a cancel request."""
    seconds = _number(ctx.payload.get("seconds", 1), "seconds")
    steps = int(_number(ctx.payload.get("steps", 1), "steps"))
    if seconds < 0 or steps < 1:
        raise PermanentError("example.sleep needs seconds >= 0 and steps >= 1")
    for step in range(1, steps + 1):
        await asyncio.sleep(seconds / steps)
        await ctx.append_event("progress", {"step": step, "steps": steps})
        await ctx.raise_if_cancelled()


async def fail(ctx: JobContext) -> None:
    """`{"message": m, "times": k}`: raise m on the first k attempts, then succeed;
    without `times`, always raise. m is the caller's text, so it is the job's
    `error_message` but stays out of the log (`private_message`)."""
    message = str(ctx.payload.get("message", "example.fail failed"))
    times = ctx.payload.get("times")
    if times is None or ctx.attempt <= _number(times, "times"):
        raise private_message(RuntimeError(message))


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PermanentError(f"payload field {name!r} must be a number")
    return float(value)


def register(registry: HandlerRegistry) -> None:
    registry.register("example.echo", echo)
    registry.register("example.sleep", sleep)
    registry.register("example.fail", fail)

"""A job kind for the log tests, loaded with `--handlers tests.system.failing_handlers`.

`test.fail-holding-payload` keeps a payload value in a local variable and then
raises an error that does not quote it: its traceback is logged, and the value
must not be (a renderer that shows locals would leak it)."""

from __future__ import annotations

from leasehold.worker import HandlerRegistry, JobContext


async def fail_holding_payload(ctx: JobContext) -> None:
    secret = str(ctx.payload["secret"])
    raise LookupError(f"no document matches ({len(secret)} characters)")


def register(registry: HandlerRegistry) -> None:
    registry.register("test.fail-holding-payload", fail_holding_payload)

"""The handler `leasehold worker-conformance` expects a worker under test to run.

    leasehold worker-conformance -- leasehold worker --handlers leasehold.conformance

The contract is the same in every language (docs/protocol.md, Conformance), so
that the tool can judge the worker's protocol behaviour and nothing else. Payload
fields, all optional:

- `sleep_ms`: wait this long, stopping early when the attempt is cancelled or its
  lease is lost;
- `echo`: any JSON value, copied into the result;
- `checkpoint`: an object saved as the attempt's checkpoint before the wait.

The result is `{"echo": payload.echo or null, "resumed_from": the checkpoint this
attempt arrived with, or null}`.

The kind is `conformance.run`, or LEASEHOLD_KIND when the tool runs the worker
with another `--kind`: the worker then claims exactly the kind the tool's server
routes to remote workers.
"""

from __future__ import annotations

import asyncio
import os

from leasehold.worker import HandlerRegistry, JobContext, PermanentError

DEFAULT_KIND = "conformance.run"
# How often the wait looks for a cancel request or a lost lease. The remote
# worker learns of both from the server's pushes (a Claim's `held`, a
# Heartbeat's reply) without a call, so looking often costs nothing, and it is
# what lets a cancel end the attempt within a fraction of a second.
CANCEL_POLL_SECONDS = 0.05


async def run(ctx: JobContext) -> dict[str, object]:
    """Save the payload's checkpoint, sleep `sleep_ms`, return the echo and the
    checkpoint this attempt resumed from."""
    # Read before saving: the result reports where this attempt began.
    resumed_from = ctx.last_checkpoint
    checkpoint = ctx.payload.get("checkpoint")
    if checkpoint is not None:
        if not isinstance(checkpoint, dict):
            raise PermanentError("payload field 'checkpoint' must be an object")
        await ctx.checkpoint(checkpoint)
    sleep_ms = ctx.payload.get("sleep_ms", 0)
    if isinstance(sleep_ms, bool) or not isinstance(sleep_ms, int | float) or sleep_ms < 0:
        raise PermanentError("payload field 'sleep_ms' must be a number of at least 0")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + sleep_ms / 1000
    # raise_if_cancelled raises JobCancelled on a cancel (the executor confirms
    # it) and LeaseLost once the lease is gone (the executor writes nothing).
    await ctx.raise_if_cancelled()
    while (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(left, CANCEL_POLL_SECONDS))
        await ctx.raise_if_cancelled()
    return {"echo": ctx.payload.get("echo"), "resumed_from": resumed_from}


def register(registry: HandlerRegistry) -> None:
    registry.register(os.environ.get("LEASEHOLD_KIND") or DEFAULT_KIND, run)

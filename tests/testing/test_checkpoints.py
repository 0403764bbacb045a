"""`leasehold.testing` and checkpoints: a handler's resume logic tested without
a server, by letting an attempt fail after a checkpoint or by starting from one.
Imports only the public API."""

from __future__ import annotations

import pytest

from leasehold.testing import JobEnvironment
from leasehold.worker import JobContext


async def copy_pages(ctx: JobContext) -> dict[str, int]:
    """Copies pages from where the last attempt stopped; the first attempt
    fails after page 1 unless the payload says otherwise."""
    start = (ctx.last_checkpoint or {}).get("next_page", 0)
    for page in range(start, ctx.payload["pages"]):
        if ctx.attempt == 1 and page == ctx.payload.get("fail_at", 2):
            raise ConnectionError("upstream went away")
        await ctx.append_event("copied", {"page": page})
        await ctx.checkpoint({"next_page": page + 1})
    return {"started_at": start}


async def test_an_attempt_after_a_failure_resumes_at_the_last_checkpoint() -> None:
    run = await JobEnvironment().run(copy_pages, {"pages": 4})

    assert (run.status, run.attempts) == ("succeeded", 2)
    assert [event.payload["page"] for event in run.handler_events] == [0, 1, 2, 3]
    assert run.result == {"started_at": 2}
    assert run.checkpoint == {"next_page": 4}


async def test_a_run_can_start_from_a_given_checkpoint() -> None:
    run = await JobEnvironment().run(copy_pages, {"pages": 4, "fail_at": -1}, checkpoint={"next_page": 3})

    assert run.handler_events == [("copied", {"page": 3})]
    assert run.result == {"started_at": 3}


async def test_a_given_checkpoint_reaches_every_attempt_until_one_saves() -> None:
    seen: list[object] = []

    async def fail_once(ctx: JobContext) -> None:
        seen.append(ctx.last_checkpoint)
        if ctx.attempt == 1:
            raise ConnectionError("before saving anything")

    run = await JobEnvironment().run(fail_once, checkpoint={"next_page": 7})

    assert run.status == "succeeded" and seen == [{"next_page": 7}, {"next_page": 7}]
    assert run.checkpoint == {"next_page": 7}


async def test_a_checkpoint_the_service_would_refuse_is_refused() -> None:
    with pytest.raises(ValueError, match="checkpoint"):
        await JobEnvironment().run(copy_pages, {"pages": 1}, checkpoint={"n": float("inf")})

    async def bad(ctx: JobContext) -> None:
        await ctx.checkpoint({"n": float("nan")})

    run = await JobEnvironment().run(bad, max_attempts=1)
    assert run.status == "failed" and "checkpoint" in (run.error_message or "")

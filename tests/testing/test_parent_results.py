"""`leasehold.testing` and a step of a graph of jobs: a handler that reads its
parents' results (`ctx.parent_results`) tested without a server. Imports only
the public API."""

from __future__ import annotations

from typing import Any

import pytest

from leasehold.testing import JobEnvironment
from leasehold.worker import JobContext, SyncJobContext

PARENTS = {"job_fetch": {"count": 2, "ratio": 0.5}, "job_load": {"count": 3}}


async def merge(ctx: JobContext) -> dict[str, Any]:
    return {
        "total": sum(result["count"] for result in ctx.parent_results.values()),
        "from": list(ctx.parent_results),
    }


async def test_the_handler_sees_the_parent_results_it_was_given_in_order() -> None:
    run = await JobEnvironment().run(merge, parent_results=PARENTS)

    assert run.status == "succeeded"
    assert run.result == {"total": 5, "from": ["job_fetch", "job_load"]}


async def test_every_attempt_sees_them() -> None:
    seen: list[dict[str, Any]] = []

    async def flaky(ctx: JobContext) -> None:
        seen.append(dict(ctx.parent_results))
        if ctx.attempt == 1:
            raise ConnectionError("once")

    run = await JobEnvironment().run(flaky, parent_results=PARENTS)

    assert (run.status, run.attempts) == ("succeeded", 2)
    assert seen == [PARENTS, PARENTS]


async def test_a_sync_handler_sees_them_too() -> None:
    def count(ctx: SyncJobContext) -> dict[str, int]:
        return {"parents": len(ctx.parent_results), "load": ctx.parent_results["job_load"]["count"]}

    run = await JobEnvironment().run(count, parent_results=PARENTS)

    assert run.result == {"parents": 2, "load": 3}


async def test_without_parents_the_mapping_is_empty() -> None:
    run = await JobEnvironment().run(merge)

    assert run.result == {"total": 0, "from": []}


async def test_the_handler_gets_copies_it_cannot_change_for_the_next_attempt() -> None:
    async def scribble(ctx: JobContext) -> None:
        ctx.parent_results["job_fetch"]["count"] = 99
        if ctx.attempt == 1:
            raise ConnectionError("once")

    given = {"job_fetch": {"count": 2}}
    seen: list[int] = []

    async def watch(ctx: JobContext) -> None:
        seen.append(ctx.parent_results["job_fetch"]["count"])
        await scribble(ctx)

    await JobEnvironment().run(watch, parent_results=given)

    assert seen == [2, 2] and given == {"job_fetch": {"count": 2}}


@pytest.mark.parametrize(
    ("results", "words"),
    [
        ({"job_a": {"n": float("nan")}}, "parent_results['job_a']"),
        ({"job_a": ["not", "an", "object"]}, "parent_results['job_a']"),
    ],
)
async def test_parent_results_the_service_could_not_hand_over_are_refused(results: Any, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        await JobEnvironment().run(merge, parent_results=results)

    assert words in str(refused.value)


async def test_parents_past_the_4_mib_bound_are_left_out_as_the_service_does() -> None:
    big = {f"job_{i:02}": {"blob": "x" * 250_000} for i in range(20)}
    small = {"job_small": {"n": 1}}

    run = await JobEnvironment().run(merge_names, parent_results={**big, **small})

    assert run.result is not None
    # 16 of 250,000-odd bytes fit in 4 MiB; the 17th does not, nor the rest,
    # while the small one after them still does.
    assert run.result["names"] == [*list(big)[:16], "job_small"]


async def merge_names(ctx: JobContext) -> dict[str, Any]:
    return {"names": list(ctx.parent_results)}


async def test_a_contexts_repr_shows_no_parent_result() -> None:
    shown: list[str] = []

    async def show(ctx: JobContext) -> None:
        shown.append(repr(ctx))

    await JobEnvironment().run(show, parent_results={"job_a": {"secret": "SECRET-VALUE"}})

    assert shown and "SECRET-VALUE" not in shown[0]

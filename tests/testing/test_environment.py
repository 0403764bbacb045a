"""`leasehold.testing.JobEnvironment`: a handler's attempts, retries, cancels
and event log, on a manual clock. Imports only the public API."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from leasehold.testing import JobEnvironment, JobRun, ManualClock
from leasehold.worker import HandlerRegistry, JobContext, PermanentError

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def types(run: JobRun) -> list[str]:
    return [event.type for event in run.events]


async def test_a_handler_that_appends_events_succeeds_with_its_log() -> None:
    async def report(ctx: JobContext) -> None:
        for step in (1, 2):
            await ctx.append_event("progress", {"step": step, "of": ctx.payload["steps"]})

    run = await JobEnvironment().run(report, {"steps": 2})

    assert (run.status, run.attempts, run.error_message) == ("succeeded", 1, None)
    assert run.handler_events == [("progress", {"step": 1, "of": 2}), ("progress", {"step": 2, "of": 2})]
    assert run.events == [
        ("job.queued", {}),
        ("job.started", {"attempt": 1}),
        *run.handler_events,
        ("job.succeeded", {}),
    ]


async def test_a_permanent_error_fails_at_once_without_backoff() -> None:
    env = JobEnvironment(ManualClock(START))

    async def reject(ctx: JobContext) -> None:
        raise PermanentError("payload needs a document_id")

    run = await env.run(reject, max_attempts=5)

    assert (run.status, run.attempts, run.error_message) == ("failed", 1, "payload needs a document_id")
    assert types(run) == ["job.queued", "job.started", "job.failed"]
    assert run.events[-1].payload["error"] == "payload needs a document_id"
    assert env.clock.now() == START  # no retry was waited for


async def test_an_ordinary_error_is_retried_until_an_attempt_succeeds() -> None:
    env = JobEnvironment(ManualClock(START))
    seen: list[int] = []

    async def flaky(ctx: JobContext) -> None:
        seen.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"upstream down (attempt {ctx.attempt})")

    run = await env.run(flaky, max_attempts=3)

    assert seen == [1, 2, 3]
    assert (run.status, run.attempts, run.error_message) == ("succeeded", 3, None)
    assert types(run) == [
        "job.queued",
        "job.started",
        "job.retry_scheduled",
        "job.started",
        "job.retry_scheduled",
        "job.started",
        "job.succeeded",
    ]
    scheduled = [event.payload for event in run.events if event.type == "job.retry_scheduled"]
    assert [(p["attempt"], p["error"]) for p in scheduled] == [
        (1, "upstream down (attempt 1)"),
        (2, "upstream down (attempt 2)"),
    ]
    # The backoff was waited for on the manual clock: 2 s, then 4 s.
    assert [p["available_at"] for p in scheduled] == ["2026-03-01T12:00:02Z", "2026-03-01T12:00:06Z"]
    assert env.clock.now() - START == timedelta(seconds=2 + 4)


async def test_an_error_on_every_attempt_fails_the_job_after_max_attempts() -> None:
    env = JobEnvironment(ManualClock(START))

    async def broken(ctx: JobContext) -> None:
        raise KeyError("missing")

    run = await env.run(broken, max_attempts=4)

    assert (run.status, run.attempts, run.error_message) == ("failed", 4, "'missing'")
    assert types(run).count("job.retry_scheduled") == 3 and types(run)[-1] == "job.failed"
    assert env.clock.now() - START == timedelta(seconds=2 + 4 + 8)


async def test_a_cancel_after_some_events_is_seen_at_the_next_safe_point() -> None:
    done: list[int] = []

    async def steps(ctx: JobContext) -> None:
        for step in range(1, 6):
            await ctx.raise_if_cancelled()
            await ctx.append_event("progress", {"step": step})
            done.append(step)

    run = await JobEnvironment().run(steps, cancel_after_events=2)

    assert done == [1, 2]
    assert (run.status, run.attempts) == ("cancelled", 1)
    assert types(run)[-4:] == ["progress", "progress", "job.cancel_requested", "job.cancelled"]


async def test_a_cancel_requested_from_another_task_while_the_handler_waits() -> None:
    env = JobEnvironment()
    started, proceed = asyncio.Event(), asyncio.Event()

    async def waits(ctx: JobContext) -> None:
        started.set()
        await proceed.wait()
        await ctx.raise_if_cancelled()
        await ctx.append_event("not reached", {})

    running = asyncio.create_task(env.run(waits))
    await asyncio.wait_for(started.wait(), 5)
    await env.cancel()
    proceed.set()
    run = await asyncio.wait_for(running, 5)

    assert run.status == "cancelled"
    assert run.handler_events == []
    assert types(run)[-2:] == ["job.cancel_requested", "job.cancelled"]


async def test_a_handler_that_returns_after_a_cancel_request_still_ends_cancelled() -> None:
    env = JobEnvironment()

    async def ignores_cancel(ctx: JobContext) -> None:
        await env.cancel()  # the owner cancels while the handler runs; it never checks

    run = await env.run(ignores_cancel)

    assert run.status == "cancelled"
    assert types(run)[-2:] == ["job.cancel_requested", "job.cancelled"]


async def test_a_handler_that_outlives_its_lease_is_fenced_off_and_the_job_runs_again() -> None:
    env = JobEnvironment(ManualClock(START), lease_seconds=30)
    writes: list[str] = []

    async def stalls_once(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            env.clock.advance(31)  # a worker frozen past its lease
        await ctx.append_event("wrote", {"attempt": ctx.attempt})
        writes.append(f"attempt {ctx.attempt}")

    run = await env.run(stalls_once)

    assert writes == ["attempt 2"]  # the stale attempt's write was refused
    assert (run.status, run.attempts) == ("succeeded", 2)
    assert run.events == [
        ("job.queued", {}),
        ("job.started", {"attempt": 1}),
        ("job.lease_expired", {"attempt": 1}),
        ("job.started", {"attempt": 2}),
        ("wrote", {"attempt": 2}),
        ("job.succeeded", {}),
    ]


async def test_a_registry_serves_the_kind_as_the_service_would() -> None:
    async def echo(ctx: JobContext) -> None:
        await ctx.append_event("echo", ctx.payload)

    registry = HandlerRegistry()
    registry.register("myapp.echo", echo)
    env = JobEnvironment()

    run = await env.run(registry, {"text": "hi", "nested": [True, None]}, kind="myapp.echo")

    assert run.handler_events == [("echo", {"text": "hi", "nested": [True, None]})]
    with pytest.raises(ValueError, match="no handler is registered for kind 'myapp.other'"):
        await env.run(registry, kind="myapp.other")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"payload": {"x": float("nan")}}, "payload: numbers must be finite"),
        ({"max_attempts": 101}, "max_attempts"),
        ({"kind": "Not A Kind"}, "invalid job kind"),
    ],
)
async def test_what_enqueue_would_refuse_is_refused(options: dict[str, object], message: str) -> None:
    async def never(ctx: JobContext) -> None:
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match=message):
        await JobEnvironment().run(never, **options)  # type: ignore[arg-type]


async def test_stored_payloads_cannot_be_changed_through_the_objects_handed_out_or_in() -> None:
    appended = {"items": ["a"]}

    async def mutates(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            await ctx.append_event("snapshot", appended)
            appended["items"].append("changed after the append")
            ctx.payload["items"].append(3)
            raise RuntimeError("try again")
        await ctx.append_event("payload seen", ctx.payload)

    run = await JobEnvironment().run(mutates, {"items": [1, 2]})

    assert run.handler_events == [("snapshot", {"items": ["a"]}), ("payload seen", {"items": [1, 2]})]


async def test_cancel_outside_a_run_is_a_mistake() -> None:
    with pytest.raises(RuntimeError, match="needs a job running"):
        await JobEnvironment().cancel()


async def test_one_environment_runs_one_job_at_a_time() -> None:
    env = JobEnvironment()
    nested: list[BaseException] = []

    async def runs_another(ctx: JobContext) -> None:
        try:
            await env.run(runs_another)
        except RuntimeError as exc:
            nested.append(exc)

    run = await env.run(runs_another)

    assert run.status == "succeeded"
    assert [str(exc) for exc in nested] == [
        "a JobEnvironment runs one job at a time; use one environment per job"
    ]


async def test_a_failed_attempt_records_its_exception_type() -> None:
    async def broken(ctx: JobContext) -> None:
        raise KeyError("missing")

    run = await JobEnvironment().run(broken, max_attempts=1)

    assert run.error_type == "KeyError"
    assert run.events[-1] == ("job.failed", {"error": "'missing'", "error_type": "KeyError"})


async def test_the_result_a_handler_returns_is_the_runs_result() -> None:
    async def measure(ctx: JobContext) -> dict[str, object]:
        return {"size": ctx.payload["n"] * 2}

    run = await JobEnvironment().run(measure, {"n": 21})

    assert (run.status, run.result) == ("succeeded", {"size": 42})


async def test_a_result_that_is_not_a_json_object_fails_the_run() -> None:
    async def wrong(ctx: JobContext) -> object:
        return ["not", "an", "object"]

    run = await JobEnvironment().run(wrong, max_attempts=1)

    assert (run.status, run.result, run.error_type) == ("failed", None, "InvalidResult")

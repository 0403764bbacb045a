"""One trace from the caller's Enqueue into the handler: each attempt the
server's runtime runs is a span whose parent is the caller's span, on a real
server over a real port, on each engine."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from structlog.testing import capture_logs

from leasehold._server import tracing
from leasehold.v1 import jobs_pb2
from leasehold.worker import HandlerRegistry, JobContext, SyncJobContext
from tests.api.helpers import FAILED, SUCCEEDED, Stub, struct, wait_for_terminal
from tests.support import OWNER, Gate, owner_metadata, test_registry
from tests.tracing.conftest import CallerSpan, SpanRecorder, caller_span

PLANTED = "PLANTED-7f3a-never-in-a-span"
# A retry policy whose waits are short enough for a test.
QUICK_RETRIES = jobs_pb2.RetryPolicy(initial_interval_seconds=0.05, max_interval_seconds=0.05)


def _handler_work(ctx: JobContext | SyncJobContext) -> None:
    with trace.get_tracer("tests.handler").start_as_current_span("handler work"):
        pass


async def _traced_async(ctx: JobContext) -> None:
    _handler_work(ctx)


@pytest.fixture
def registry(gate: Gate) -> HandlerRegistry:
    registry = test_registry(gate)
    registry.register("test.traced-async", _traced_async)
    registry.register("test.traced-sync", _handler_work)  # runs in a worker thread
    return registry


async def _enqueue(stub: Stub, metadata: tuple[tuple[str, str], ...], kind: str, **fields: object) -> str:
    payload = fields.pop("payload", {})
    request = jobs_pb2.EnqueueRequest(kind=kind, payload=struct(payload), **fields)  # type: ignore[arg-type]
    response = await stub.Enqueue(request, metadata=metadata)
    assert response.created
    return str(response.job.id)


def _assert_child_of(span: ReadableSpan, caller: CallerSpan) -> None:
    assert span.context is not None and span.parent is not None, span
    assert span.context.trace_id == caller.context.trace_id
    assert span.parent.span_id == caller.context.span_id
    assert span.parent.is_remote


def _assert_nothing_planted(span: ReadableSpan) -> None:
    assert PLANTED not in repr(dict(span.attributes or {}))
    assert PLANTED not in (span.status.description or "")
    assert not span.events  # no recorded exception, whose text would quote it


async def test_an_attempts_span_is_the_child_of_the_callers_span(stub: Stub, spans: SpanRecorder) -> None:
    with caller_span() as caller:
        job_id = await _enqueue(stub, caller.metadata, "example.echo", payload={"secret": PLANTED})
    assert (await wait_for_terminal(stub, job_id)).status == SUCCEEDED

    (span,) = await spans.attempts_of(job_id)

    _assert_child_of(span, caller)
    assert span.kind is SpanKind.CONSUMER
    assert span.name == "process example.echo"
    assert dict(span.attributes or {}) == {
        "messaging.system": "leasehold",
        "messaging.operation.type": "process",
        "messaging.destination.name": "example.echo",
        "messaging.message.id": job_id,
        tracing.ATTRIBUTE_JOB_ID: job_id,
        tracing.ATTRIBUTE_KIND: "example.echo",
        tracing.ATTRIBUTE_ATTEMPT: 1,
        tracing.ATTRIBUTE_MAX_ATTEMPTS: 3,
        tracing.ATTRIBUTE_OUTCOME: "succeeded",
    }
    assert span.status.status_code is StatusCode.UNSET
    _assert_nothing_planted(span)


async def test_every_attempt_of_a_failing_job_is_in_the_callers_trace(
    stub: Stub, spans: SpanRecorder
) -> None:
    with caller_span() as caller:
        job_id = await _enqueue(
            stub,
            caller.metadata,
            "example.fail",
            payload={"message": PLANTED, "times": 1},
            retry_policy=QUICK_RETRIES,
        )
    assert (await wait_for_terminal(stub, job_id)).status == SUCCEEDED

    first, second = await spans.attempts_of(job_id, count=2)

    for span in (first, second):
        _assert_child_of(span, caller)
        _assert_nothing_planted(span)
    assert first.context is not None and second.context is not None
    assert first.context.span_id != second.context.span_id
    attributes = [dict(span.attributes or {}) for span in (first, second)]
    assert [a[tracing.ATTRIBUTE_ATTEMPT] for a in attributes] == [1, 2]
    assert [a[tracing.ATTRIBUTE_OUTCOME] for a in attributes] == ["failed", "succeeded"]
    assert attributes[0][tracing.ATTRIBUTE_ERROR_TYPE] == "RuntimeError"
    assert tracing.ATTRIBUTE_ERROR_TYPE not in attributes[1]
    assert [span.status.status_code for span in (first, second)] == [StatusCode.ERROR, StatusCode.UNSET]


async def test_a_retried_job_continues_the_trace_of_the_call_that_enqueued_its_source(
    stub: Stub, spans: SpanRecorder
) -> None:
    with caller_span() as caller:
        job_id = await _enqueue(stub, caller.metadata, "example.fail", max_attempts=1)
    assert (await wait_for_terminal(stub, job_id)).status == FAILED
    # Retried by a call that sends no traceparent of its own.
    retry = await stub.Retry(jobs_pb2.RetryRequest(job_id=job_id), metadata=owner_metadata())
    await wait_for_terminal(stub, retry.job.id)

    (source,) = await spans.attempts_of(job_id)
    (retried,) = await spans.attempts_of(retry.job.id)

    _assert_child_of(source, caller)
    _assert_child_of(retried, caller)


async def test_a_job_enqueued_without_a_traceparent_runs_in_a_root_span(
    stub: Stub, spans: SpanRecorder
) -> None:
    with caller_span():  # a span is current here, but nothing carries it
        job_id = await _enqueue(stub, owner_metadata(), "example.echo")
    assert (await wait_for_terminal(stub, job_id)).status == SUCCEEDED

    (span,) = await spans.attempts_of(job_id)

    assert span.parent is None
    assert dict(span.attributes or {})[tracing.ATTRIBUTE_OUTCOME] == "succeeded"


async def test_each_item_of_a_batch_is_in_the_callers_trace(stub: Stub, spans: SpanRecorder) -> None:
    items = [jobs_pb2.EnqueueRequest(kind="example.echo") for _ in range(3)]
    with caller_span() as caller:
        response = await stub.BatchEnqueue(
            jobs_pb2.BatchEnqueueRequest(requests=items), metadata=caller.metadata
        )
    job_ids = [item.job.id for item in response.responses]
    for job_id in job_ids:
        await wait_for_terminal(stub, job_id)

    for job_id in job_ids:
        (span,) = await spans.attempts_of(job_id)
        _assert_child_of(span, caller)


MALFORMED = (
    "not-a-traceparent",
    # Uppercase hex, which the W3C format does not allow.
    "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
    # An all-zero trace id, and an all-zero parent id.
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    # Version ff is invalid; version 00 has exactly four fields.
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
    "x" * 4000,
)


async def test_a_malformed_traceparent_is_ignored_and_the_job_runs_in_a_root_span(
    stub: Stub, spans: SpanRecorder
) -> None:
    """The documented behaviour (docs/tracing.md): W3C Trace Context asks a
    receiver to ignore a traceparent it cannot parse, so the Enqueue succeeds
    and only the trace is lost; the log says so, without the value."""
    job_ids = []
    with capture_logs() as logs:
        for value in MALFORMED:
            job_ids.append(await _enqueue(stub, (*owner_metadata(), ("traceparent", value)), "example.echo"))

    for job_id in job_ids:
        assert (await wait_for_terminal(stub, job_id)).status == SUCCEEDED
        (span,) = await spans.attempts_of(job_id)
        assert span.parent is None
    ignored = [record for record in logs if record["event"] == "traceparent.ignored"]
    assert len(ignored) == len(MALFORMED)
    assert {(record["method"], record["owner_id"]) for record in ignored} == {("Enqueue", OWNER)}
    assert not any(value in repr(logs) for value in MALFORMED)


@pytest.mark.parametrize("kind", ["test.traced-async", "test.traced-sync"])
async def test_spans_a_handler_opens_are_children_of_its_attempts_span(
    stub: Stub, spans: SpanRecorder, kind: str
) -> None:
    with caller_span() as caller:
        job_id = await _enqueue(stub, caller.metadata, kind)
    assert (await wait_for_terminal(stub, job_id)).status == SUCCEEDED

    (attempt,) = await spans.attempts_of(job_id)
    (work,) = [span for span in spans.spans() if span.name == "handler work"]

    _assert_child_of(attempt, caller)
    assert attempt.context is not None and work.parent is not None
    assert work.parent.span_id == attempt.context.span_id
    assert not work.parent.is_remote

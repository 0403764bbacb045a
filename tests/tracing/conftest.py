from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from leasehold._server import tracing
from tests.api.helpers import WAIT
from tests.support import OWNER, owner_metadata


class SpanRecorder(SimpleSpanProcessor):
    """Keeps the spans that end while a test is recording, and wakes whoever
    waits for one. The provider is the process's global one and can be set
    only once: between tracing tests, what other tests' attempts end is dropped."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        super().__init__(self.exporter)
        self.recording = False
        self._ended = threading.Condition()

    def on_end(self, span: ReadableSpan) -> None:
        if not self.recording:
            return
        super().on_end(span)
        with self._ended:
            self._ended.notify_all()

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    async def wait_for(
        self, found: Callable[[list[ReadableSpan]], bool], what: str, timeout: float = WAIT
    ) -> list[ReadableSpan]:
        """Every span so far, once `found` holds for them; the wait is on the
        span processor's own signal, in a thread, so the loop keeps serving."""

        def wait() -> bool:
            with self._ended:
                return self._ended.wait_for(lambda: found(self.spans()), timeout)

        assert await asyncio.to_thread(wait), f"no {what}; spans: {[s.name for s in self.spans()]}"
        return self.spans()

    async def attempts_of(self, job_id: str, count: int = 1) -> list[ReadableSpan]:
        """The attempt spans of `job_id`, in attempt order, once `count` have ended."""

        def attempts(spans: list[ReadableSpan]) -> list[ReadableSpan]:
            mine = [s for s in spans if (s.attributes or {}).get(tracing.ATTRIBUTE_JOB_ID) == job_id]
            return sorted(mine, key=lambda s: (s.attributes or {})[tracing.ATTRIBUTE_ATTEMPT])

        await self.wait_for(
            lambda spans: len(attempts(spans)) >= count, f"{count} attempt span(s) of {job_id}"
        )
        return attempts(self.spans())


_RECORDER: SpanRecorder | None = None


def _installed_recorder() -> SpanRecorder:
    global _RECORDER
    if _RECORDER is None:
        provider = TracerProvider()
        _RECORDER = SpanRecorder()
        provider.add_span_processor(_RECORDER)
        trace.set_tracer_provider(provider)
        assert trace.get_tracer_provider() is provider, "another tracer provider was installed first"
    return _RECORDER


@pytest.fixture
def spans() -> Iterator[SpanRecorder]:
    recorder = _installed_recorder()
    recorder.exporter.clear()
    recorder.recording = True
    try:
        yield recorder
    finally:
        recorder.recording = False
        recorder.exporter.clear()


@dataclass(frozen=True)
class CallerSpan:
    """The caller's side of a traced Enqueue: its span, and the metadata that
    carries it (the owner and the W3C traceparent the SDK's propagator wrote)."""

    context: SpanContext
    metadata: tuple[tuple[str, str], ...]
    traceparent: str


@contextlib.contextmanager
def caller_span(owner: str = OWNER) -> Iterator[CallerSpan]:
    with trace.get_tracer("tests.caller").start_as_current_span("caller") as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        yield CallerSpan(
            span.get_span_context(), (*owner_metadata(owner), *carrier.items()), carrier["traceparent"]
        )

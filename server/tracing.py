"""OpenTelemetry, when the `otel` extra is installed: each attempt is a span,
the child of the traceparent its job carries (DESIGN §13), and the standard
OTEL_* environment variables turn export on.

This is the one module that imports OpenTelemetry. Without the extra every
function here is a no-op and the service runs as it does with tracing off.
A span names the job, its kind, the attempt and how it ended; never a payload,
a result or an error message, which may hold what the caller sent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from leasehold._server.jobs.records import Job

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed
    trace = None  # type: ignore[assignment]

AVAILABLE = trace is not None
INSTRUMENTATION_NAME = "leasehold"

# Span attributes: messaging conventions a tracing UI understands, and the
# attempt's own facts under leasehold.*.
SYSTEM = "leasehold"
ATTRIBUTE_JOB_ID = "leasehold.job.id"
ATTRIBUTE_KIND = "leasehold.job.kind"
ATTRIBUTE_ATTEMPT = "leasehold.attempt"
ATTRIBUTE_MAX_ATTEMPTS = "leasehold.max_attempts"
ATTRIBUTE_OUTCOME = "leasehold.outcome"
ATTRIBUTE_ERROR_TYPE = "error.type"
# Outcomes that mark the span as an error.
ERROR_OUTCOMES = frozenset({"failed", "lease_lost"})

if AVAILABLE:
    _PROPAGATOR = TraceContextTextMapPropagator()
    # A proxy until a provider is set (by `export_from_environment`, by
    # `opentelemetry-instrument`, or by a test), and that provider's after.
    _TRACER = trace.get_tracer(INSTRUMENTATION_NAME)
    _NOTHING_RECORDS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


class AttemptSpan:
    """What the executor tells the span of one attempt: how it ended."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def ended(self, outcome: str, error_type: str | None = None) -> None:
        """`outcome`: succeeded, failed, cancelled, lease_lost or released;
        `error_type`: a failure's exception class name."""
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attribute(ATTRIBUTE_OUTCOME, outcome)
        if error_type:
            span.set_attribute(ATTRIBUTE_ERROR_TYPE, error_type)
        if outcome in ERROR_OUTCOMES:
            # No description: an error's text may quote the payload.
            span.set_status(trace.StatusCode.ERROR)


@contextlib.contextmanager
def attempt_span(job: Job) -> Iterator[AttemptSpan]:
    """The span of `job`'s current attempt, current while the handler runs (so
    spans the handler opens are its children, in a sync handler's thread too),
    and the child of the job's traceparent; a root span when it has none."""
    if not AVAILABLE or isinstance(trace.get_tracer_provider(), _NOTHING_RECORDS):
        # No provider installed: the API's no-op spans would cost each attempt
        # a context switch and a parse for nothing.
        yield AttemptSpan()
        return
    parent = (
        _PROPAGATOR.extract({"traceparent": job.traceparent}) if job.traceparent else otel_context.Context()
    )
    with _TRACER.start_as_current_span(
        f"process {job.kind}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=_attributes(job),
        # The exception's text and traceback could quote the payload.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield AttemptSpan(span)


def _attributes(job: Job) -> dict[str, str | int]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": job.kind,
        "messaging.message.id": job.id,
        ATTRIBUTE_JOB_ID: job.id,
        ATTRIBUTE_KIND: job.kind,
        ATTRIBUTE_ATTEMPT: job.attempt,
        ATTRIBUTE_MAX_ATTEMPTS: job.max_attempts,
    }


# ----- export ---------------------------------------------------------------------------

EXPORTERS = ("otlp", "console", "none")
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


class Export:
    """The span export a process set up; leaving it (`with`) flushes and stops
    it, so the spans of a process's last attempts are sent before it exits."""

    def __init__(self, description: str, provider: Any = None) -> None:
        self.description = description
        self._provider = provider

    def __enter__(self) -> Export:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def export_from_environment(environ: Mapping[str, str], service_name: str) -> Export:
    """Export spans as the OTEL_* variables say: OTEL_TRACES_EXPORTER `otlp`
    (gRPC; endpoint, headers and TLS from the OTEL_EXPORTER_OTLP_* variables),
    `console` or `none`. Unset, it is `otlp` when an OTLP endpoint is set and
    `none` otherwise, so installing the extra alone sends nothing anywhere.
    OTEL_SDK_DISABLED=true turns it off; a provider someone else installed
    (`opentelemetry-instrument`) is kept. Raises ValueError naming the variable."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Export("off (OTEL_SDK_DISABLED)")
    if AVAILABLE and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return Export("the tracer provider already installed")
    exporter = exporter_name(environ)
    if exporter == "none":
        return Export("off")
    if not AVAILABLE:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER: {exporter} needs the otel extra; pip install 'leasehold[otel]'"
        )
    return _install(environ, exporter, service_name)


def exporter_name(environ: Mapping[str, str]) -> str:
    """Which of EXPORTERS the variables ask for; ValueError naming the variable
    for one this service cannot honour."""
    names = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [name for name in names if name]
    if not names:
        names = ["otlp" if any(environ.get(name) for name in _ENDPOINTS) else "none"]
    if len(names) > 1 or names[0] not in EXPORTERS:
        raise ValueError(f"OTEL_TRACES_EXPORTER: one of {', '.join(EXPORTERS)}")
    if names[0] == "otlp":
        _check_protocol(environ)
    return names[0]


def _check_protocol(environ: Mapping[str, str]) -> None:
    """The traces protocol, or else the general one, must be gRPC's: the
    extra installs that exporter only."""
    for name in _PROTOCOLS:
        protocol = environ.get(name, "").strip()
        if protocol:
            if protocol != "grpc":
                raise ValueError(f"{name}: only grpc is supported (got {protocol!r})")
            return


def _install(environ: Mapping[str, str], exporter: str, service_name: str) -> Export:
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        raise ValueError(
            "OTEL_TRACES_EXPORTER: the OpenTelemetry SDK is not installed; pip install 'leasehold[otel]'"
        ) from None
    span_exporter: SpanExporter
    if exporter == "otlp":
        span_exporter = _otlp_exporter()
    else:
        span_exporter = ConsoleSpanExporter()
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name;
    # the sampler (OTEL_TRACES_SAMPLER) and batching (OTEL_BSP_*) read theirs.
    named = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    return Export(exporter, provider)


def _otlp_exporter() -> Any:
    """It reads its endpoint, headers, TLS and timeout from the OTEL_EXPORTER_OTLP_*
    variables itself."""
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ValueError(
            "OTEL_TRACES_EXPORTER: otlp needs opentelemetry-exporter-otlp-proto-grpc; "
            "pip install 'leasehold[otel]'"
        ) from None
    return OTLPSpanExporter()

"""An operator turns export on with the standard OTEL_* variables: a real
`leasehold serve` and a real `leasehold worker` send their attempt spans over
OTLP/gRPC to a collector (here a TraceService on a real port), each span the
child of the caller's traceparent, each process under its own service name."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from leasehold._server import tracing
from leasehold.v1 import jobs_pb2
from tests.remote_worker.fake_server import TOKEN
from tests.support import owner_metadata, sqlite_url
from tests.system.helpers import EXIT_SECONDS, Client, Leasehold, wait_until

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps each exported span with its process's service name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[tuple[str, Any]] = []

    def Export(  # noqa: N802 (the RPC's own name)
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            for resource_spans in request.resource_spans:
                service = _attributes(resource_spans.resource.attributes).get("service.name", "")
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((service, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def attempt_of(self, job_id: str) -> tuple[str, Any] | None:
        with self._lock:
            for service, span in self.spans:
                if _attributes(span.attributes).get(tracing.ATTRIBUTE_JOB_ID) == job_id:
                    return service, span
        return None


def _attributes(pairs: Any) -> dict[str, Any]:
    def value(any_value: AnyValue) -> Any:
        return getattr(any_value, any_value.WhichOneof("value") or "string_value")

    return {pair.key: value(pair.value) for pair in pairs}


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    servicer = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(None)


def test_serve_and_worker_export_attempt_spans_in_the_callers_trace_over_otlp(
    tmp_path: Path, collector: tuple[Collector, int], processes: Callable[[Leasehold], Leasehold]
) -> None:
    spans, collector_port = collector
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector_port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        # Nothing is sent on a timer while the test runs: what arrives was
        # flushed by each process as it stopped.
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        "LEASEHOLD_WORKER_TOKEN": TOKEN,
    }
    server = processes(Leasehold.serve(sqlite_url(tmp_path), "--remote-kinds", "remote.*", env=otel))
    port = server.start()
    worker = processes(
        Leasehold(
            "worker", "--server", f"127.0.0.1:{port}", "--handlers", "tests.remote_worker.handlers", env=otel
        )
    )
    worker.launch()
    wait_until(lambda: worker.events("worker.started"), 30, "the worker to start")
    with Client(port) as client:
        client.metadata = (*owner_metadata(), ("traceparent", TRACEPARENT))
        local = client.enqueue("example.echo", {"secret": "PLANTED-in-the-payload"})
        remote = client.enqueue("remote.double", {"n": 2})
        for job in (local, remote):
            assert client.wait_terminal(job.id).status == jobs_pb2.JOB_STATUS_SUCCEEDED

    assert spans.attempt_of(local.id) is spans.attempt_of(remote.id) is None
    assert worker.interrupt() < EXIT_SECONDS and server.interrupt() < EXIT_SECONDS
    assert (worker.returncode, server.returncode) == (0, 0)

    found = {job.id: spans.attempt_of(job.id) for job in (local, remote)}
    assert None not in found.values(), spans.spans

    assert {job_id: attempt[0] for job_id, attempt in found.items() if attempt} == {
        local.id: "leasehold",
        remote.id: "leasehold-worker",
    }
    for _, span in filter(None, found.values()):
        assert span.trace_id.hex() == TRACE_ID
        assert span.parent_span_id.hex() == CALLER_SPAN_ID
        assert "PLANTED" not in str(span)
    assert [r["exporter"] for r in server.events("tracing.export")] == ["otlp"]
    assert [r["exporter"] for r in worker.events("tracing.export")] == ["otlp"]

"""The parts on their own: the traceparent check (what is kept, in its
version-00 form, and what is ignored), and which exporter the OTEL_* variables
choose."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from leasehold._server import tracing
from leasehold._server.api.trace_context import normalised, traceparent_of

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        (VALID, VALID),
        (f"00-{TRACE_ID}-{PARENT_ID}-00", f"00-{TRACE_ID}-{PARENT_ID}-00"),
        (f" {VALID}\t", VALID),
        # A later version is read as version 00, its extra fields dropped.
        (f"01-{TRACE_ID}-{PARENT_ID}-03-more-fields", f"00-{TRACE_ID}-{PARENT_ID}-03"),
        (f"cc-{TRACE_ID}-{PARENT_ID}-01", f"00-{TRACE_ID}-{PARENT_ID}-01"),
    ],
)
def test_a_valid_traceparent_is_kept_in_its_version_00_form(sent: str, kept: str) -> None:
    assert normalised(sent) == kept


@pytest.mark.parametrize(
    "sent",
    [
        "",
        "garbage",
        VALID.upper(),
        f"ff-{TRACE_ID}-{PARENT_ID}-01",
        f"00-{'0' * 32}-{PARENT_ID}-01",
        f"00-{TRACE_ID}-{'0' * 16}-01",
        f"{VALID}-extra",
        f"01-{TRACE_ID}-{PARENT_ID}-01x",
        f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",
        f"00-{TRACE_ID}-{PARENT_ID}-1",
        f"00_{TRACE_ID}_{PARENT_ID}_01",
    ],
)
def test_a_malformed_traceparent_is_not(sent: str) -> None:
    assert normalised(sent) is None


def test_the_metadata_entry_is_read_by_its_lowercase_name() -> None:
    assert traceparent_of((("x-owner-id", "o"), ("traceparent", VALID)), "Enqueue", "o") == VALID
    assert traceparent_of((("x-owner-id", "o"),), "Enqueue", "o") is None


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ((("traceparent", VALID), ("traceparent", VALID)), "sent more than once"),
        ((("traceparent", VALID.encode()),), "not text"),
        ((("traceparent", "garbage-4711"),), "not a W3C traceparent"),
    ],
)
def test_what_is_ignored_is_logged_with_its_reason_and_never_its_value(
    metadata: tuple[tuple[str, str | bytes], ...], reason: str
) -> None:
    with capture_logs() as logs:
        assert traceparent_of(metadata, "BatchEnqueue", "owner-1") is None

    assert logs == [
        {
            "event": "traceparent.ignored",
            "log_level": "warning",
            "method": "BatchEnqueue",
            "owner_id": "owner-1",
            "reason": reason,
        }
    ]


@pytest.mark.parametrize(
    ("environ", "exporter"),
    [
        ({}, "none"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, "none"),
        ({"OTEL_TRACES_EXPORTER": " Console "}, "console"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "otlp"),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            "otlp",
        ),
    ],
)
def test_the_otel_variables_choose_the_exporter(environ: dict[str, str], exporter: str) -> None:
    assert tracing.exporter_name(environ) == exporter


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER: one of otlp, console, none"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER: one of otlp, console, none"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "OTEL_EXPORTER_OTLP_PROTOCOL: only grpc is supported (got 'http/protobuf')",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_variable(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        tracing.exporter_name(environ)

    assert str(refused.value) == message


def test_export_stays_off_when_the_sdk_is_disabled() -> None:
    environ = {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}

    assert tracing.export_from_environment(environ, "leasehold").description == "off (OTEL_SDK_DISABLED)"

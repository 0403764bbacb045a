"""The traceparent check, on its own: what is kept (in its version-00 form)
and what is ignored, without OpenTelemetry."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

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
    assert traceparent_of((("x-owner-id", "o"), ("traceparent", VALID)), "Enqueue") == VALID
    assert traceparent_of((("x-owner-id", "o"),), "Enqueue") is None


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
        assert traceparent_of(metadata, "BatchEnqueue") is None

    assert logs == [
        {"event": "traceparent.ignored", "log_level": "warning", "method": "BatchEnqueue", "reason": reason}
    ]

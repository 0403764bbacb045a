"""The W3C `traceparent` a caller sends with Enqueue or BatchEnqueue, as gRPC
metadata, checked here and kept with the job as a plain string.

The format is checked without OpenTelemetry: the job carries the caller's trace
whether or not this server has the `otel` extra (a remote worker may have it).
A malformed value is ignored, as the W3C Trace Context recommendation asks of
every receiver (the job then runs in a trace of its own): tracing must never
be why a job is refused. Each ignored value is logged, without the value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import structlog

log = structlog.get_logger("leasehold.api")

TRACEPARENT_HEADER = "traceparent"

# version-trace_id-parent_id-flags, lowercase hex (W3C Trace Context, level 1).
# A later version may append fields after a dash; version 00 may not.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_INVALID_VERSION = "ff"
_ZERO_TRACE_ID = "0" * 32
_ZERO_PARENT_ID = "0" * 16

Metadata = Sequence[tuple[str, str | bytes]]


def traceparent_of(metadata: Metadata, method: str, owner: str) -> str | None:
    """The call's traceparent in its version-00 form, or None when it sent none
    or one that is malformed (`method` and `owner` name the call in that log
    record)."""
    values = [value for key, value in metadata if key.lower() == TRACEPARENT_HEADER]
    if not values:
        return None
    problem = _problem(values)
    if problem is None:
        found = normalised(str(values[0]))
        if found is not None:
            return found
        problem = "not a W3C traceparent"
    log.warning("traceparent.ignored", method=method, owner_id=owner, reason=problem)
    return None


def _problem(values: list[str | bytes]) -> str | None:
    if len(values) > 1:
        return "sent more than once"
    if isinstance(values[0], bytes):
        return "not text"
    return None


def normalised(value: str) -> str | None:
    """`value` as the version-00 traceparent it stands for, or None if it is not
    one. A later version's extra fields are dropped, as a version-00 reader must."""
    match = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == _INVALID_VERSION or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE_ID or parent_id == _ZERO_PARENT_ID:
        return None
    return f"00-{trace_id}-{parent_id}-{flags}"

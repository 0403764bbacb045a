"""What the service accepts: limits on jobs, payloads, events and error text, and the checks
that enforce them (raising `InvalidArgument` naming the field)."""

from __future__ import annotations

import math
import re
from typing import Any

from google.protobuf import struct_pb2

from leasehold._server.jobs.errors import InvalidArgument

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_TIMEOUT_SECONDS = 900
MAX_ATTEMPTS_LIMIT = 100
TIMEOUT_SECONDS_LIMIT = 86_400
ERROR_TEXT_LIMIT = 1000
ERROR_TYPE_LIMIT = 128
PAYLOAD_BYTES_LIMIT = 256 * 1024
# Each level of JSON nesting is two protobuf message levels, and an event carrying
# a payload back sits a few levels deeper still. 32 keeps every such message well
# inside protobuf's recursion limit of 100, so whatever is accepted can be watched.
PAYLOAD_DEPTH_LIMIT = 32
KIND_PATTERN = re.compile(r"[a-z0-9._-]{1,128}")
EVENT_TYPE_LIMIT = 128
RESERVED_EVENT_PREFIX = "job."
# PostgreSQL's text type cannot store U+0000, so no stored string holds one.
NUL = "\x00"


def error_text(exc: BaseException) -> str:
    """What a failed attempt records: the exception's text, bounded.

    This is not a redactor: handlers must raise errors that are safe to show.
    """
    return storable_error(str(exc) or type(exc).__name__)


def storable_error(text: str) -> str:
    """An error message as stored: bounded, and with any NUL (which PostgreSQL
    cannot store, and a handler's exception may well carry) replaced by U+FFFD,
    so that recording a failure can never itself fail."""
    return text[:ERROR_TEXT_LIMIT].replace(NUL, "\ufffd")


def storable_error_type(name: str | None) -> str | None:
    """An exception type as stored: bounded like a kind, NUL replaced; empty is none."""
    if not name:
        return None
    return name[:ERROR_TYPE_LIMIT].replace(NUL, "\ufffd")


def check_event_type(event_type: str, field: str = "event_type") -> None:
    """A handler's or a worker's own event type: 1-128 characters, no NUL, and
    not in the service's reserved `job.` namespace."""
    if not event_type or len(event_type) > EVENT_TYPE_LIMIT:
        raise InvalidArgument(field, f"must be 1-{EVENT_TYPE_LIMIT} characters")
    if NUL in event_type:
        raise InvalidArgument(field, "must not contain NUL characters")
    if event_type.startswith(RESERVED_EVENT_PREFIX):
        raise InvalidArgument(field, "types starting with 'job.' are reserved")


def is_valid_kind(kind: str) -> bool:
    return KIND_PATTERN.fullmatch(kind) is not None


# The largest integer magnitude a double holds to the nearest power of two.
_DOUBLE_INTEGER_LIMIT = 2**1023


def check_payload(value: Any, field: str = "payload", serialized_bytes: int | None = None) -> None:
    """Refuse what could not travel back out as a `google.protobuf.Struct`: a
    non-object, NaN or Infinity, numbers beyond a double, over-deep nesting, or
    more than 256 KiB. Job payloads and handler events share these rules, so an
    event that was written can always be watched."""
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be a JSON object")
    # Depth first, before anything recursive looks at the value (a cycle, too,
    # ends here as too deep).
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > PAYLOAD_DEPTH_LIMIT:
                limit = PAYLOAD_DEPTH_LIMIT
                raise InvalidArgument(field, f"must be nested at most {limit} objects or lists deep")
            if isinstance(item, dict) and not all(isinstance(key, str) for key in item):
                raise InvalidArgument(field, "object keys must be strings")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, float) and not math.isfinite(item):
            raise InvalidArgument(field, "numbers must be finite (no NaN or Infinity)")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > _DOUBLE_INTEGER_LIMIT:
            raise InvalidArgument(field, "numbers must fit in a double")
    if serialized_bytes is not None:  # it arrived as a Struct, already measured
        size = serialized_bytes
    else:
        try:
            size = serialized_size(value)
        except (TypeError, ValueError) as exc:  # a value JSON takes but a Struct does not
            raise InvalidArgument(field, f"must be plain JSON ({exc})") from None
    if size > PAYLOAD_BYTES_LIMIT:
        raise InvalidArgument(field, f"must be at most {PAYLOAD_BYTES_LIMIT} bytes serialized")


def serialized_size(value: dict[str, Any]) -> int:
    """Bytes of `value` as a `google.protobuf.Struct`: the serialization the API states
    its limit in, so a job payload and a handler's event are measured alike, and text
    that JSON would escape (non-ASCII, quotes, control characters) costs no more."""
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct.ByteSize()

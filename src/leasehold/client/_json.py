"""Messages as Python values, with numbers as a JSON parser would give them.

A `google.protobuf.Struct` carries every number as a double, so `{"width": 1024}`
sent by a caller comes out of a result or an event payload as `1024.0`, and
`range(payload["n"])` fails. This is the one place that undoes it, shared by the
client's callers, the command line's output and the server's handlers, so the
rule cannot differ between them.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

# The largest magnitude up to which a double holds every integer exactly. Past
# it, 2**53 + 1 has already become 2**53 on the wire, so turning such a number
# into an int would claim a precision the caller's value never had: it stays a
# float. (Within it, the value an int was sent as comes back exactly.)
EXACT_INTEGER_LIMIT = 2**53


def integral_numbers_as_int(value: Any) -> Any:
    """`value` with every integral float within +-2**53 (in dicts and lists, at any
    depth) turned into an int; other floats, bools, strings and None unchanged."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= EXACT_INTEGER_LIMIT:
            return int(value)
        return value
    if isinstance(value, dict):
        return {key: integral_numbers_as_int(item) for key, item in value.items()}
    if isinstance(value, list):
        return [integral_numbers_as_int(item) for item in value]
    return value


def to_dict(message: Message) -> dict[str, Any]:
    """`message` as `json_format.MessageToDict` renders it (camelCase keys, int64
    as strings, Timestamps as RFC 3339), except that integral numbers within
    +-2**53 are `int`: what Python's `json` would give for the JSON the caller
    sent. For a `Struct` (a job's `result`, an event's `payload`) that is the JSON
    object itself: `to_dict(job.result)["width"]` is `1024`, not `1024.0`.

    Raises ValueError for a NaN or an infinity, which JSON cannot hold (the
    service never stores one)."""
    converted: dict[str, Any] = integral_numbers_as_int(json_format.MessageToDict(message))
    return converted

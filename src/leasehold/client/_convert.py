"""Python values to the proto fields the requests take."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2


def struct(payload: Mapping[str, Any] | None) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(dict(payload or {}))
    return value


def timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A Timestamp; a naive datetime is refused, since guessing its zone would
    silently move a job's run time by hours."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        raise ValueError("run_at must be timezone-aware (e.g. datetime.now(UTC))")
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value

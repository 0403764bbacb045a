"""The wire's timestamps: Leasehold's own conversion must say exactly what
protobuf's `Timestamp.FromDatetime` says, for every instant a job can carry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf import timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st

from leasehold._server.api.convert import timestamp

OFFSETS = st.integers(min_value=-14 * 60, max_value=14 * 60).map(lambda m: timezone(timedelta(minutes=m)))


def from_datetime(value: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=OFFSETS))
def test_an_aware_datetime_converts_as_protobuf_converts_it(value: datetime) -> None:
    assert timestamp(value) == from_datetime(value)


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)))
def test_a_naive_datetime_is_read_as_utc(value: datetime) -> None:
    assert timestamp(value) == from_datetime(value.replace(tzinfo=UTC))
    assert timestamp(value) == from_datetime(value)


def test_before_the_epoch_the_nanos_stay_positive() -> None:
    stamp = timestamp(datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC))
    assert stamp is not None and (stamp.seconds, stamp.nanos) == (-1, 500_000_000)
    assert timestamp(None) is None

"""Relative times: each unit from its size up to the next, floored, in both
directions, and the absolute UTC time kept beside them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf import timestamp_pb2

from leasehold._server.dashboard.moments import due, moment, relative

NOW = datetime(2026, 12, 6, 0, 20, 8, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "now"),
        (0.9, "now"),
        (-0.9, "now"),
        (1, "in 1 s"),
        (59.9, "in 59 s"),
        (60, "in 1 min"),
        (3_599, "in 59 min"),
        (3_480, "in 58 min"),
        (3_600, "in 1 h"),
        (7_200, "in 2 h"),
        (86_399, "in 23 h"),
        (86_400, "in 1 d"),
        (10 * 86_400 + 5, "in 10 d"),
        (-1, "1 s ago"),
        (-59, "59 s ago"),
        (-60, "1 min ago"),
        (-180, "3 min ago"),
        (-3_599, "59 min ago"),
        (-3_600, "1 h ago"),
        (-86_399, "23 h ago"),
        (-86_400, "1 d ago"),
        (-400 * 86_400, "400 d ago"),
    ],
)
def test_relative_says_how_far_and_which_way(seconds: float, said: str) -> None:
    assert relative(at(seconds), NOW) == said


def test_a_job_not_yet_due_is_due_in_and_never_due_since() -> None:
    assert due(at(3_480), NOW) == "due in 58 min"
    assert due(at(-180), NOW) == "due 3 min ago"
    assert due(NOW, NOW) == "due now"
    assert "since" not in due(at(3_600), NOW)


def test_a_moment_keeps_the_absolute_utc_time_for_its_title_and_datetime() -> None:
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(at(3_480))
    shown = moment(value, NOW, as_due=True)
    assert shown is not None
    assert shown.text == "due in 58 min"
    assert shown.iso == "2026-12-06T01:18:08Z"
    assert shown.utc == "2026-12-06 01:18:08 UTC"
    plain = moment(value, NOW)
    assert plain is not None and plain.text == "in 58 min"


def test_an_unset_time_is_no_moment() -> None:
    assert moment(timestamp_pb2.Timestamp(), NOW) is None
    assert moment(None, NOW) is None

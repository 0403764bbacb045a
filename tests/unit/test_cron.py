"""Cron rules against croniter's own iteration, and the DST rules where the two
part ways on purpose (server/jobs/cron.py says why)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from leasehold._server.jobs.cron import CronRule
from leasehold._server.jobs.errors import InvalidArgument

NEW_YORK = ZoneInfo("America/New_York")
YEAR_START = datetime(2026, 1, 1, tzinfo=UTC)
YEAR_END = datetime(2027, 1, 1, tzinfo=UTC)
# 2026's changes in New York: clocks skip 02:00-03:00 on 8 March and repeat
# 01:00-02:00 on 1 November.
SPRING_FORWARD = datetime(2026, 3, 8, tzinfo=NEW_YORK)
FALL_BACK = datetime(2026, 11, 1, tzinfo=NEW_YORK)


def croniter_firings(cron: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    iterator = croniter(cron, start.astimezone(ZoneInfo(zone)))
    found = []
    while (moment := iterator.get_next(datetime)) <= end:
        found.append(moment.astimezone(UTC))
    return found


@pytest.mark.parametrize(
    ("cron", "zone", "start", "end"),
    [
        ("* * * * *", "UTC", YEAR_START, YEAR_START + timedelta(days=2)),
        ("30 * * * *", "UTC", YEAR_START, YEAR_START + timedelta(days=40)),
        ("0 9 * * 1-5", "America/New_York", YEAR_START, YEAR_END),
        ("0 9 * * mon-fri", "America/New_York", YEAR_START, YEAR_END),
        ("0 0 L * *", "UTC", YEAR_START, YEAR_END),
        ("15 10 L * *", "America/New_York", YEAR_START, YEAR_END),
        ("*/7 3-5 1,15 jan,jul *", "Europe/Berlin", YEAR_START, YEAR_END),
        ("0 12 * * 5#2", "Asia/Tokyo", YEAR_START, YEAR_END),
    ],
)
def test_firings_match_croniter_where_no_clock_change_intervenes(
    cron: str, zone: str, start: datetime, end: datetime
) -> None:
    """None of these rules names a wall-clock time a DST change skips or repeats
    (09:00, 10:15, 12:00 and 03:00-05:59 in Berlin exist once on every day), so
    croniter and the rule must agree on every firing of the year."""
    rule = CronRule.parse(cron, zone)
    ours = rule.firings(start, end)
    assert ours == croniter_firings(cron, zone, start, end)
    assert len(ours) >= 12


def test_weekdays_at_nine_in_new_york_stay_at_nine_across_both_changes() -> None:
    rule = CronRule.parse("0 9 * * 1-5", "America/New_York")
    firings = rule.firings(YEAR_START, YEAR_END)
    assert {moment.astimezone(NEW_YORK).hour for moment in firings} == {9}
    # In UTC the firing moves an hour with each change.
    assert rule.next_after(datetime(2026, 3, 6, 15, tzinfo=UTC)) == datetime(2026, 3, 9, 13, tzinfo=UTC)
    assert rule.next_after(datetime(2026, 10, 30, 14, tzinfo=UTC)) == datetime(2026, 11, 2, 14, tzinfo=UTC)
    assert len(firings) == 261  # the weekdays of 2026


def test_a_time_the_spring_change_skips_does_not_fire_that_day() -> None:
    rule = CronRule.parse("30 2 * * *", "America/New_York")
    start = SPRING_FORWARD - timedelta(days=2)
    ours = [
        moment.astimezone(NEW_YORK).date().day for moment in rule.firings(start, start + timedelta(days=4))
    ]
    assert ours == [6, 7, 9]  # no 02:30 on the 8th
    # croniter fires it at 03:00 instead: the difference is deliberate.
    theirs = croniter_firings("30 2 * * *", "America/New_York", start, start + timedelta(days=4))
    assert len(theirs) == 4


def test_a_time_the_autumn_change_repeats_fires_once_at_its_first_occurrence() -> None:
    rule = CronRule.parse("30 1 * * *", "America/New_York")
    start = FALL_BACK - timedelta(days=1)
    ours = rule.firings(start, start + timedelta(days=3))
    assert [moment.astimezone(NEW_YORK).day for moment in ours] == [31, 1, 2]
    assert ours[1] == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT, not 01:30 EST
    theirs = croniter_firings("30 1 * * *", "America/New_York", start, start + timedelta(days=3))
    assert len(theirs) == 4  # croniter fires both 01:30s


def test_an_hourly_rule_across_the_autumn_change_never_goes_back_in_time() -> None:
    rule = CronRule.parse("30 * * * *", "America/New_York")
    ours = rule.firings(FALL_BACK, FALL_BACK + timedelta(hours=4))
    assert ours == sorted(ours) and len(set(ours)) == len(ours)
    local = [moment.astimezone(NEW_YORK).strftime("%H:%M") for moment in ours]
    assert local == ["00:30", "01:30", "02:30", "03:30"]


def test_latest_at_or_before_in_the_repeated_hour_sees_the_first_pass() -> None:
    """At 01:15 EST (the second 01:15), the last firing of a rule every 20
    minutes was 01:40 EDT, an hour of wall-clock 'later' minutes ago."""
    rule = CronRule.parse("*/20 * * * *", "America/New_York")
    second_pass = datetime(2026, 11, 1, 6, 15, tzinfo=UTC)
    assert rule.latest_at_or_before(second_pass) == datetime(2026, 11, 1, 5, 40, tzinfo=UTC)
    assert rule.next_after(second_pass) == datetime(2026, 11, 1, 7, 0, tzinfo=UTC)  # 02:00 EST
    exact = datetime(2026, 1, 1, 0, 20, tzinfo=UTC)
    assert CronRule.parse("*/20 * * * *", "UTC").latest_at_or_before(exact) == exact


@pytest.mark.parametrize(
    ("cron", "zone", "field", "words"),
    [
        ("* * * *", "UTC", "cron", "5 fields"),
        ("* * * * * *", "UTC", "cron", "5 fields"),
        ("61 * * * *", "UTC", "cron", "not a valid cron"),
        ("*/0 * * * *", "UTC", "cron", "not a valid cron"),
        ("0 0 30 2 *", "UTC", "cron", "matches no date"),
        ("@daily", "UTC", "cron", "5 fields"),
        ("H * * * *", "UTC", "cron", "hashed (H)"),
        ("H(0-5) * * * *", "UTC", "cron", "hashed (H)"),
        # croniter draws R anew each time a rule is read: it fired 7 times in 3 hours.
        ("R * * * *", "UTC", "cron", "random (R)"),
        ("0 r * * *", "UTC", "cron", "random (R)"),
        ("0 9 * * *", "Mars/Olympus_Mons", "time_zone", "not an IANA"),
        ("0 9 * * *", "../../etc/passwd", "time_zone", "not an IANA"),
    ],
)
def test_bad_rules_are_refused_naming_the_field(cron: str, zone: str, field: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        CronRule.parse(cron, zone)
    assert caught.value.field == field
    assert words in caught.value.description


def test_a_rule_whose_every_match_a_clock_change_skips_never_fires_and_never_raises() -> None:
    """02:30 on the second Sunday of March never exists in New York: croniter would search
    past year 9999 and raise ValueError; the rule says None (CreateSchedule refuses it)."""
    rule = CronRule.parse("30 2 * 3 0#2", "America/New_York")
    assert rule.next_after(YEAR_START) is None
    # Before 2007 New York changed its clocks in April, so the rule last fired in 2006:
    # further back than a search looks (ten years), so none is found.
    assert rule.latest_at_or_before(YEAR_END) is None
    assert rule.latest_at_or_before(datetime(2015, 1, 1, tzinfo=UTC)) == datetime(
        2006, 3, 12, 7, 30, tzinfo=UTC
    )
    # Names with an r or an h inside stay names.
    assert CronRule.parse("0 9 * mar thu,fri", "UTC").next_after(YEAR_START) == datetime(
        2026, 3, 5, 9, tzinfo=UTC
    )


def test_names_and_the_default_zone() -> None:
    rule = CronRule.parse("  0  9 * JAN   MON ", "")
    assert (rule.expression, rule.zone_name) == ("0 9 * JAN MON", "UTC")


_FIELD_TEXT = (
    st.text(alphabet="0123456789*/,-LW#?HRjanmonFEBsun ", min_size=1, max_size=12).map(str.strip).filter(bool)
)


@settings(max_examples=400, deadline=None)
@given(fields=st.lists(_FIELD_TEXT, min_size=1, max_size=7), zone=st.text(max_size=40))
def test_any_rule_and_zone_text_is_parsed_or_refused_naming_the_field(fields: list[str], zone: str) -> None:
    """Whatever croniter or zoneinfo make of odd text (they raise many kinds of
    error), the answer is a rule or InvalidArgument naming cron or time_zone."""
    try:
        rule = CronRule.parse(" ".join(fields), zone)
    except InvalidArgument as exc:
        assert exc.field in {"cron", "time_zone"}
        return
    moment = rule.next_after(YEAR_START)
    assert moment is None or moment > YEAR_START


@pytest.mark.parametrize(
    "expression",
    ["30 2 * 3 0#2", "* 2 * 3 0#2", "*/5 2 8-14 3 0#2"],
    ids=["once a year", "every minute of the gap", "every five minutes of the gap"],
)
def test_a_rule_the_clocks_always_skip_is_given_up_on_after_bounded_work(
    expression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CreateSchedule evaluates a caller's rule: one whose every match falls in a
    spring-forward gap must cost a bounded number of croniter steps, not a walk
    of the calendar to year 9999 (thousands of steps, most of a second of CPU)."""
    steps = Counter[str]()
    for direction in ("get_next", "get_prev"):
        original = getattr(croniter, direction)

        def counted(self: croniter, *args: object, _original=original, _name=direction) -> object:
            steps[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(croniter, direction, counted)
    rule = CronRule.parse(expression, "America/New_York")
    steps.clear()  # parsing takes one step of its own
    assert rule.next_after(YEAR_START) is None
    assert rule.latest_at_or_before(YEAR_END) is None
    assert 0 < steps["get_next"] <= 301 and 0 < steps["get_prev"] <= 301, steps

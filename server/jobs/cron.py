"""Cron rules read in an IANA time zone, with the DST rules cron users expect.

croniter does the calendar (ranges, steps, lists, names, `L`, `#`), on naive
wall-clock times; this module maps those to instants itself, because
croniter's own zone handling moves a time that a spring-forward change skips
to the first valid minute after it, and fires a time that an autumn change
repeats twice. Here:

- a wall-clock time that does not exist on a day (the clocks jumped over it)
  does not fire that day;
- a wall-clock time that happens twice fires once, at its first occurrence.

Both follow from one mapping: each naive time is read with `fold=0` (its first
occurrence), and kept only when it reads back as itself. That mapping is
monotonic in the naive time, which is what lets `next_after` and
`latest_at_or_before` walk croniter's naive iteration and stop at the first
time that qualifies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from leasehold._server.jobs.errors import InvalidArgument

CRON_FIELDS = 5
# Naive candidates a search may pass over before it gives up. A candidate is
# passed over only when the zone's clocks skip it (or, looking forward, when a
# repeated hour reads it as before the start), and a five-field rule has at
# most one candidate a minute, so a rule that fires at all passes over at most
# one clock change's worth (two hours, in the zones with the longest) before
# it fires. A rule whose every match the clocks skip (`30 2 * 3 0#2` in
# America/New_York) ends here after a bounded amount of work, instead of
# walking croniter's calendar year by year to 9999 on the caller's CPU.
_SEARCH_STEPS = 300
# And how far past the start a passed-over candidate may lie before the search
# gives up: every rule that fires at all fires within eight years (the 29th of
# February, across a century year that is not a leap year), so a rule whose
# every match for longer is skipped by the clocks never fires.
_SEARCH_SPAN = timedelta(days=366 * 10)
# croniter's own extensions, as a field's whole token (not the h of "thu").
_CRONITER_EXTENSION = re.compile(r"(?<![a-z])[rh](?![a-z])", re.IGNORECASE)
_ONE_MICROSECOND = timedelta(microseconds=1)


def time_zone(name: str) -> ZoneInfo:
    """The IANA zone `name` ("" means UTC), or InvalidArgument naming time_zone.
    The `tzdata` package backs `zoneinfo` where the system has no database."""
    if not name:
        name = "UTC"
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument("time_zone", f"{name!r} is not an IANA time zone name") from None


@dataclass(frozen=True)
class CronRule:
    """A checked five-field cron expression and the zone it is read in."""

    expression: str
    zone: ZoneInfo

    @classmethod
    def parse(cls, expression: str, zone_name: str) -> CronRule:
        """The rule, or InvalidArgument naming `cron` or `time_zone`. A rule that
        can never fire (the 30th of February) is refused here, not found out
        by the scheduler."""
        zone = time_zone(zone_name)
        fields = expression.split()
        if len(fields) != CRON_FIELDS:
            raise InvalidArgument(
                "cron",
                f"must have 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}",
            )
        normalized = " ".join(fields)
        if _CRONITER_EXTENSION.search(normalized):
            # croniter's R draws a new random value each time a rule is read, and H
            # needs a hash key: neither names the same times on every replica and read.
            raise InvalidArgument(
                "cron", f"{normalized!r}: random (R) and hashed (H) fields are not supported"
            )
        try:
            iterator = croniter(normalized, datetime(2000, 1, 1))
            iterator.get_next(datetime)
        except CroniterBadDateError:
            raise InvalidArgument("cron", f"{normalized!r} matches no date") from None
        except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
            raise InvalidArgument("cron", f"{normalized!r} is not a valid cron expression: {exc}") from None
        return cls(normalized, zone)

    @property
    def zone_name(self) -> str:
        return self.zone.key

    def next_after(self, instant: datetime) -> datetime | None:
        """The first firing strictly after `instant` (UTC), or None if none is
        found (a rule matching no date left within croniter's search)."""
        # No naive time before `instant`'s own reads as an instant after it:
        # the mapping is monotonic and a repeated hour reads as its first pass.
        start = self._wall(instant)
        try:
            iterator = croniter(self.expression, start - _ONE_MICROSECOND)
            for _ in range(_SEARCH_STEPS):
                wall = iterator.get_next(datetime)
                fire_at = self._instant(wall)
                if fire_at is not None and fire_at > instant:
                    return fire_at
                if wall - start > _SEARCH_SPAN:
                    return None
        except (CroniterBadDateError, ValueError, OverflowError):
            # ValueError: croniter searched past year 9999 (every matching wall time
            # is one the zone's clock changes skip).
            return None
        return None

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The last firing at or before `instant` (UTC), or None."""
        local = instant.astimezone(self.zone)
        start = local.replace(tzinfo=None)
        if local.fold:
            # In the second pass of a repeated hour, the first pass's later
            # times (naive times after this one) fired before now.
            start += local.replace(fold=0).utcoffset() - local.utcoffset()  # type: ignore[operator]
        try:
            iterator = croniter(self.expression, start + _ONE_MICROSECOND)
            for _ in range(_SEARCH_STEPS):
                wall = iterator.get_prev(datetime)
                fire_at = self._instant(wall)
                if fire_at is not None and fire_at <= instant:
                    return fire_at
                if start - wall > _SEARCH_SPAN:
                    return None
        except (CroniterBadDateError, ValueError, OverflowError):
            # ValueError: croniter searched past year 9999 (every matching wall time
            # is one the zone's clock changes skip).
            return None
        return None

    def firings(self, after: datetime, until: datetime) -> list[datetime]:
        """Every firing in (after, until], in order; for tests and small spans."""
        found = []
        moment = self.next_after(after)
        while moment is not None and moment <= until:
            found.append(moment)
            moment = self.next_after(moment)
        return found

    def _wall(self, instant: datetime) -> datetime:
        return instant.astimezone(self.zone).replace(tzinfo=None)

    def _instant(self, wall: datetime) -> datetime | None:
        """The instant of naive wall-clock time `wall` (its first occurrence), or
        None when the zone's clocks skip it."""
        moment = wall.replace(tzinfo=self.zone, fold=0)
        utc = moment.astimezone(UTC)
        if utc.astimezone(self.zone).replace(tzinfo=None) != wall:
            return None
        return utc

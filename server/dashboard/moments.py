"""Times as a reader wants them: relative to now ("in 58 min", "3 min ago"),
with the absolute UTC time kept beside them for a hover or a copy.

`now` always comes from the dashboard's injected clock, so a page says the same
thing in a test every time; these functions only do arithmetic on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

# Each unit is used from its size up to the next unit's size, floored: 59 s,
# then 1 min; 59 min, then 1 h; 23 h, then 1 d. Flooring never says "in 1 h"
# of something 59 minutes away.
_UNITS = ((86_400, "d"), (3_600, "h"), (60, "min"), (1, "s"))


def relative(moment: datetime, now: datetime) -> str:
    """`in 58 min`, `3 min ago`, `in 2 h`, `5 d ago`; `now` within a second."""
    seconds = (moment - now).total_seconds()
    size = abs(seconds)
    if size < 1:
        return "now"
    amount, unit = next((int(size // length), name) for length, name in _UNITS if size >= length)
    return f"in {amount} {unit}" if seconds > 0 else f"{amount} {unit} ago"


def due(moment: datetime, now: datetime) -> str:
    """When a queued job may start: `due in 58 min` while it is not yet due,
    `due 3 min ago` once it is, `due now` at the moment itself."""
    return f"due {relative(moment, now)}"


@dataclass(frozen=True)
class Moment:
    """A time as a page shows it: `text` relative to now, `iso` for a
    `<time datetime>` and `utc` for its title."""

    text: str
    iso: str
    utc: str


def moment(value: timestamp_pb2.Timestamp | None, now: datetime, *, as_due: bool = False) -> Moment | None:
    """A protobuf time as a Moment (worded as `due …` when `as_due`); None
    when unset, which a page shows as a dash."""
    if value is None or (value.seconds == 0 and value.nanos == 0):
        return None
    at = value.ToDatetime(tzinfo=UTC)
    return Moment(
        text=due(at, now) if as_due else relative(at, now),
        iso=at.isoformat().replace("+00:00", "Z"),
        utc=at.strftime("%Y-%m-%d %H:%M:%S UTC"),
    )

"""`serve --kind-limit`, `--owner-limit`, `--owner-weight` and `--kind-rate` as a
`steering.Steering`, or ValueError naming the flag and the value it refused."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from leasehold._server.jobs import limits
from leasehold._server.jobs.steering import Rate, Steering

# Far above any real deployment, low enough that a typo (a timestamp pasted
# into the wrong flag) is refused rather than taken as "no limit".
MAX_RUNNING_LIMIT = 100_000
MAX_RATE_PER_SECOND = 100_000.0
MAX_BURST = 100_000
MAX_WEIGHT = 1_000.0
OWNER_ID_LIMIT = 128
_RATE = re.compile(r"(?P<rate>[^/:]+)/s(?::(?P<burst>.+))?")


def steering(
    kind_limits: Sequence[str],
    owner_limit: str | None,
    owner_weights: Sequence[str],
    kind_rates: Sequence[str],
    source: dict[str, str] | None = None,
) -> Steering:
    """`source` maps each setting to how it was given (`--kind-limit`, or
    `LEASEHOLD_KIND_LIMIT`); errors name it."""
    names = {
        "kind_limit": "--kind-limit",
        "owner_limit": "--owner-limit",
        "owner_weight": "--owner-weight",
        "kind_rate": "--kind-rate",
        **(source or {}),
    }
    by_kind: dict[str, int] = {}
    for item in kind_limits:
        kind, value = _pair(names["kind_limit"], item, "KIND=N")
        _kind(names["kind_limit"], item, kind)
        by_kind[kind] = _count(names["kind_limit"], item, value, MAX_RUNNING_LIMIT)
    weights: dict[str, float] = {}
    for item in owner_weights:
        owner, value = _pair(names["owner_weight"], item, "OWNER=W")
        if not 1 <= len(owner) <= OWNER_ID_LIMIT:
            raise ValueError(
                f"{names['owner_weight']}: {item!r}: the owner must be 1-{OWNER_ID_LIMIT} characters"
            )
        weights[owner] = _positive(names["owner_weight"], item, value, MAX_WEIGHT)
    rates: dict[str, Rate] = {}
    for item in kind_rates:
        kind, value = _pair(names["kind_rate"], item, "KIND=R/s[:BURST]")
        _kind(names["kind_rate"], item, kind)
        match = _RATE.fullmatch(value)
        if match is None:
            raise ValueError(
                f"{names['kind_rate']}: {item!r}: expected KIND=R/s or KIND=R/s:BURST, e.g. pdf.render=10/s:5"
            )
        per_second = _positive(names["kind_rate"], item, match["rate"], MAX_RATE_PER_SECOND)
        burst = (
            _count(names["kind_rate"], item, match["burst"], MAX_BURST)
            if match["burst"] is not None
            else max(1, math.ceil(per_second))
        )
        rates[kind] = Rate(per_second, burst)
    limit = (
        None
        if owner_limit is None
        else _count(names["owner_limit"], owner_limit, owner_limit, MAX_RUNNING_LIMIT)
    )
    return Steering(kind_limits=by_kind, owner_limit=limit, owner_weights=weights, kind_rates=rates)


def _pair(flag: str, item: str, shape: str) -> tuple[str, str]:
    name, sep, value = item.rpartition("=")
    if not sep or not name or not value:
        raise ValueError(f"{flag}: {item!r}: expected {shape}")
    return name, value


def _kind(flag: str, item: str, kind: str) -> None:
    if not limits.is_valid_kind(kind):
        raise ValueError(f"{flag}: {item!r}: the kind must be 1-128 characters of [a-z0-9._-]")


def _count(flag: str, item: str, text: str, maximum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{flag}: {item!r}: {text!r} is not a whole number") from None
    if not 1 <= value <= maximum:
        raise ValueError(f"{flag}: {item!r}: must be between 1 and {maximum}")
    return value


def _positive(flag: str, item: str, text: str, maximum: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: {item!r}: {text!r} is not a number") from None
    if not 0 < value <= maximum:  # also refuses NaN
        raise ValueError(f"{flag}: {item!r}: must be more than 0 and at most {maximum:g}")
    return value

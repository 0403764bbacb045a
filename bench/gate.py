"""The start gate of the serve-process drain figures: every seeded job becomes due at one instant,
while every consumer process is already up and idle.

Why a gate: a drain figure must leave process start-up out (Python imports, connections, a
migration check), and with three replicas it must not let the first one drain alone while the
others are still starting. So jobs are seeded "not yet due" (a month ahead), the consumers start
and settle, and then one UPDATE makes every job due at T0 = now + DUE_MARGIN_SECONDS. Each
system finds T0 by its own scheduling of delayed work, which is how it would wake for any job
enqueued with a delay: Leasehold's claim loop looks at least every `--poll-seconds` (1 s) and
then sleeps until the next job is due; pgqueuer's trigger announces the UPDATE and its consumer
sleeps until the earliest `execute_after`. DUE_MARGIN_SECONDS exceeds the poll interval, so every
consumer has seen T0 before it arrives.

The figure itself is timed by the systems' own stamps (first claim to last completion), so how
promptly a consumer wakes at T0 does not enter it; the bench reports that delay beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.common import BenchError

SETTLE_SECONDS = 0.5  # after the last consumer says it is up
DUE_MARGIN_SECONDS = 1.5  # from the UPDATE to T0; must exceed `serve --poll-seconds` (1 s)


def release(make_due: Callable[[float], int], tidy: Callable[[], None], expected: int) -> float:
    """Make every held-back job due at T0 (`make_due(T0)` returns how many it changed), tidy the
    table (VACUUM), and return T0 (time.time() seconds). Raises BenchError when the jobs were
    not all there, or when the tidying ran past T0 (the drain would have begun during it)."""
    time.sleep(SETTLE_SECONDS)
    due = time.time() + DUE_MARGIN_SECONDS
    changed = make_due(due)
    if changed != expected:
        raise BenchError(f"start gate: {changed} of {expected} jobs were waiting to be released")
    tidy()
    if time.time() > due - 0.1:
        raise BenchError(
            f"start gate: tidying the table took longer than the {DUE_MARGIN_SECONDS:g} s margin"
        )
    return due

"""(h) The same with uvloop where it applies: Enqueue at c=64 (the no-op server on uvloop too,
the client unchanged), the in-process drain, and end to end.

The servers get `--event-loop uvloop`; a Leasehold build without that flag makes its two server
figures skipped (the in-process drain picks its loop itself and always runs). These figures have
informational targets with the same goals as their asyncio counterparts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

from bench.common import FigureSkipped
from bench.context import RoundContext, RoundItem, Skipped
from bench.figures import drain, e2e, enqueue

FIGURES = (
    "baseline.grpc_unary.c64.uvloop",
    "leasehold.enqueue.c64.uvloop",
    "leasehold.drain.c64.uvloop",
    "leasehold.e2e.uvloop",
)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    if importlib.util.find_spec("uvloop") is None:
        yield Skipped(FIGURES, "uvloop is not installed (pip install -e '.[bench]')")
        return
    yield from enqueue.pairs(ctx, (64,), "uvloop")
    sizes = ctx.sizes
    template = ctx.templates.jobs("bench.noop", sizes.drain_jobs)
    database = ctx.copy(template, "drain-uvloop.db")
    yield drain.measure(ctx.directory, database, sizes.drain_jobs, sizes.drain_concurrency, "uvloop")
    try:
        yield e2e.measure(ctx, "uvloop")
    except FigureSkipped as skip:
        yield Skipped(("leasehold.e2e.uvloop",), str(skip))

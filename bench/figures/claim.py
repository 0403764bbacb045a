"""(f) Claim cost: claim(limit=1)+succeed pairs/s with few vs many queued jobs, in-process, beside
baseline 2 (raw sqlite3) at the same two queue sizes.

A child process opens a fresh copy of a template holding `queued` queued jobs with
`SqlJobRepository` and, one pair at a time, awaits `claim(worker, limit=1, lease 30 s)` then
`succeed(lease)`: `warmup` untimed pairs, then `pairs` timed ones. Each await is its own group
commit, so this is the per-claim cost the runtime pays when one slot frees at a time. The target
is the ratio many/few: a claim that scans the queue would get slower as the queue grows; an
index-served one does not. The raw sqlite3 loop (bench.baselines.raw_sqlite) runs the same
comparison with the least work a claim can do, and its pairs/s show what the stack costs.

`leasehold.claim.many_owners` is the many-queued case with the jobs dealt to many owners
(DESIGN §11: 100,000 over 1,000), so each claim walks owners in the fair-share order; its
target divides it by the few-queued figure, as its goal is stated.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import Measurement, sqlite_url
from bench.context import RoundContext, RoundItem
from bench.procs import run_child
from leasehold._server.clock import SystemClock
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.logs import configure_logging

WARMUP = 20
WORKER = "bench-claimer"


async def claim_pairs(database: str, pairs: int, warmup: int) -> dict[str, Any]:
    """Run in a child process: time `pairs` sequential claim(limit=1)+succeed pairs."""
    configure_logging("info")
    repo = SqlJobRepository(create_engines(sqlite_url(Path(database))), SystemClock())

    async def pair() -> None:
        result = await repo.claim(WORKER, 1, 30)
        if len(result.jobs) != 1:
            raise RuntimeError("claim found no job")
        await repo.succeed(result.jobs[0].lease)

    try:
        for _ in range(warmup):
            await pair()
        began = time.perf_counter()
        for _ in range(pairs):
            await pair()
        seconds = time.perf_counter() - began
    finally:
        await repo.close()
    return {"pairs": pairs, "seconds": seconds, "rate": pairs / seconds}


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    pairs = sizes.claim_pairs
    for label, queued in (("few", sizes.claim_few), ("many", sizes.claim_many)):
        yield from _case(ctx, label, queued, pairs)
    # DESIGN §11: the many-queued claim with its jobs spread over many owners, so every claim
    # walks owners (steering.choose) rather than one owner's queue.
    template = ctx.templates.jobs("bench.hold", sizes.claim_many, owners=sizes.claim_owners)
    result = run_child(
        ctx.directory,
        "claim-many-owners",
        "bench.figures.claim:claim_pairs",
        {"database": str(ctx.copy(template, "claim-many-owners.db")), "pairs": pairs, "warmup": WARMUP},
        timeout=600,
    )
    params = {
        "queued": sizes.claim_many,
        "owners": sizes.claim_owners,
        "pairs": pairs,
        "warmup_pairs": WARMUP,
    }
    yield Measurement("leasehold.claim.many_owners", result["rate"], "pairs/s", "leasehold", params)


def _case(ctx: RoundContext, label: str, queued: int, pairs: int) -> Iterator[RoundItem]:
    """One queue size: the raw sqlite3 loop, then Leasehold's claim, back to back."""
    raw = run_child(
        ctx.directory,
        f"raw-sqlite-{label}",
        "bench.baselines.raw_sqlite:claim_complete_pairs",
        {
            "database": str(ctx.directory / f"raw-{label}.db"),
            "queued": queued,
            "pairs": pairs,
            "warmup": WARMUP,
        },
        timeout=600,
    )
    params = {"queued": queued, "pairs": pairs, "warmup_pairs": WARMUP}
    yield Measurement(f"baseline.raw_sqlite.{label}", raw["rate"], "pairs/s", "baseline", params)
    template = ctx.templates.jobs("bench.hold", queued)
    result = run_child(
        ctx.directory,
        f"claim-{label}",
        "bench.figures.claim:claim_pairs",
        {"database": str(ctx.copy(template, f"claim-{label}.db")), "pairs": pairs, "warmup": WARMUP},
        timeout=600,
    )
    yield Measurement(f"leasehold.claim.{label}", result["rate"], "pairs/s", "leasehold", dict(params))

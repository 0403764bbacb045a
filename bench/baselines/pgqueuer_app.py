"""The pgqueuer baseline's consumer process: one no-op entrypoint, run by pgqueuer's own runner.

    BENCH_PG_DSN=postgresql://... python -m bench.baselines.pgqueuer_app --batch-size 10

`create` is the factory pgqueuer's runner expects (an async context manager yielding a manager):
a `QueueManager` over one asyncpg connection (pgqueuer's default driver, and the faster of its two
per its own docs), which it uses for its queries and for LISTEN alike. `main` hands it to
`pgqueuer.run`, the function its `pgq run` command calls ("run a worker from factory, as pgq run
does, without the CLI"), with INFO logging as `pgq run` sets up. Why not `pgq run` itself:
pgqueuer 1.6.0's command crashes at start-up with typer 0.29 (its `--log-level` arrives as a
string where it expects its LogLevel enum: AttributeError in setup_fancy_logger). Everything
else is pgqueuer's default: durable tables, LISTEN/NOTIFY wake-ups, no concurrency limit
(`max_concurrent_tasks` None), completions logged in batches, dequeue timeout 30 s.

The only addition: once connected, the factory creates the file named by $BENCH_READY, so the
bench knows the consumer process is up (it still sets up its listener after that; the bench
leaves it a settle time, see bench.gate).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pgqueuer
from pgqueuer import QueueManager
from pgqueuer.core import logconfig
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

NOOP = "bench.noop"
DSN_ENV = "BENCH_PG_DSN"
READY_ENV = "BENCH_READY"


@asynccontextmanager
async def create() -> AsyncIterator[QueueManager]:
    connection = await asyncpg.connect(os.environ[DSN_ENV])
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint(NOOP)
        async def noop(job: Job) -> None:
            return None

        ready = os.environ.get(READY_ENV)
        if ready:
            Path(ready).touch()
        yield manager
    finally:
        await connection.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.pgqueuer_app")
    parser.add_argument("--batch-size", type=int, default=10, help="jobs per dequeue (pgqueuer's default 10)")
    options = parser.parse_args(argv)
    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)
    # pgqueuer.run handles SIGINT/SIGTERM itself: the consumer stops cleanly.
    asyncio.run(pgqueuer.run(create, batch_size=options.batch_size))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The suite: which groups run, in which order, round after round, and what gets printed.

A group measures one Leasehold figure (or a few) together with the baseline it is divided by, back
to back, so a ratio never mixes a quiet moment with a noisy one. huey's drain is the baseline of
two figures, so it is a group of its own that runs between them (drain, huey_drain, e2e);
pgqueuer's drain, the baseline of three, likewise (pgqueuer, then pg_drain); and Celery on Redis,
the baseline of e2e_defaults, likewise (celery, then e2e_defaults; Celery's trickle is measured
inside the trickle group, beside huey's). Without redis-server or Celery each Celery figure gets
a `skipped` line saying what to install.
Rounds are the outer loop: round 1 runs every selected group, then round 2, and so on, so slow
drifts of the machine spread over all figures alike instead of landing on one. Each group and
round gets a fresh directory.

The PostgreSQL groups share one durable throwaway cluster, started by the first of them
that runs and destroyed at the end (bench.postgres); each figure gets a fresh database on it.
Without PostgreSQL's binaries those groups crash (loudly, every round) unless left out.

A group that raises is reported (one `error` line) and the run goes on; the exit status is then 1.
A figure that cannot run on this build (FigureSkipped) gets a `skipped` line and does not change
the exit status.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import procs
from bench.baselines import celery_bench
from bench.common import Emitter, FigureSkipped, Measurement, progress
from bench.context import RoundContext, RoundItem, Sizes, Skipped, Templates
from bench.figures import (
    append_cost,
    batch_e2e,
    bulk_cancel,
    burst_lag,
    cancel_push,
    claim,
    claim_wakeup,
    cross_replica,
    drain,
    e2e,
    enqueue,
    feed,
    graphs,
    load_lag,
    node_drain,
    processes,
    remote_drain,
    retention,
    rss,
    serve_drain,
    shutdown,
    starved,
    trickle,
    uvloop,
    watch,
    watch_streams,
)
from bench.postgres import BenchPostgres
from bench.targets import evaluate, table


@dataclass(frozen=True)
class Group:
    name: str
    run: Callable[[RoundContext], Iterator[RoundItem]]
    needs: tuple[str, ...] = ()
    about: str = ""
    postgres: bool = False  # needs the run's PostgreSQL cluster (and so its binaries)


def _groups() -> tuple[Group, ...]:
    return (
        Group("enqueue", enqueue.run, about="(a) Enqueue c=1/16/64 vs no-op grpc.aio unary"),
        Group("drain", drain.run, ("huey_drain",), "(b) in-process runtime drain (c=64; c=2 informational)"),
        Group("huey_drain", drain.run_huey, about="baseline: huey SqliteHuey drain"),
        Group("e2e", e2e.run, ("huey_drain",), "(c) enqueue at full rate while serve drains"),
        Group("uvloop", uvloop.run, ("huey_drain",), "(h) enqueue c=64 (+ no-op), drain, e2e on uvloop"),
        Group("trickle", trickle.run, about="(d) enqueue->start latency, beside huey's and Celery's"),
        Group("replay", watch.run_replay, about="(e) WatchEvents replay vs no-op grpc.aio streaming"),
        Group("live_lag", watch.run_live_lag, about="(e) live lag with many watchers"),
        Group("claim_cost", claim.run, about="(f) claim+succeed pairs/s, few vs many queued (+ raw sqlite3)"),
        Group("rss", rss.run, about="(g) peak RSS with many queued jobs and idle watchers"),
        Group("watch_streams", watch_streams.run, about="server RSS with 2,000 idle WatchEvents streams"),
        # PostgreSQL. pgqueuer's drain is the baseline of pg_drain, measured just before it.
        Group(
            "pgqueuer",
            serve_drain.run_pgqueuer,
            about="baseline: pgqueuer drain on PostgreSQL",
            postgres=True,
        ),
        Group(
            "pg_drain",
            serve_drain.run,
            ("pgqueuer",),
            "serve drain: SQLite x1, PostgreSQL x1 and x3 replicas, vs pgqueuer",
            postgres=True,
        ),
        Group(
            "pg_trickle", trickle.run_postgres, about="enqueue->start latency on PostgreSQL", postgres=True
        ),
        Group(
            "pg_cross_replica",
            cross_replica.run,
            about="event delay: handler on replica B, stream on replica A",
            postgres=True,
        ),
        # Remote workers (DESIGN §10): WorkerService and `leasehold worker`.
        Group("claim_wakeup", claim_wakeup.run, about="enqueue->Claim return of a waiting long poll"),
        Group("cancel_push", cancel_push.run, about="Cancel->news in a remote worker's waiting Claim"),
        Group(
            "pg_claim_wakeup",
            claim_wakeup.run_postgres,
            about="enqueue->Claim return on PostgreSQL",
            postgres=True,
        ),
        Group(
            "remote_drain",
            remote_drain.run,
            about="drain by 1 (c=64) and 2 (c=32 each) `leasehold worker`s vs in-process c=64",
        ),
        # DESIGN §22: the TypeScript SDK's worker, vs in-process and a hand-written Node worker.
        Group(
            "node_drain",
            node_drain.run,
            about="drain by TypeScript SDK workers (1x64, 2x32) vs in-process and a unary Node worker",
        ),
        Group("remote_live_lag", watch.run_remote_live_lag, about="(e) live lag, tickers in a worker"),
        # DESIGN §15: e2e with the enqueues batched, against the same huey drain as e2e.
        Group(
            "batch_e2e",
            batch_e2e.run,
            ("huey_drain",),
            "e2e through BatchEnqueue (100 a call, 8 clients) while serve drains at its defaults",
        ),
        # Realistic load: many jobs, each with its own watcher.
        Group("burst_lag", burst_lag.run, about="live lag, 300 and 1,000 jobs enqueued and watched at once"),
        # DESIGN §20: `serve --processes 2` against 1, same round.
        Group(
            "processes",
            processes.run,
            about="serve --processes 1 vs 2: drain, Enqueue over 8 connections, the 300-job burst",
        ),
        Group("load_lag", load_lag.run, about="live lag, 10/300/1,000 jobs with one watcher each"),
        Group("remote_load_lag", load_lag.run_remote, about="live lag, 300 jobs, tickers in a worker"),
        Group("append_cost", append_cost.run, about="serve drain: jobs appending 1 event vs no-op jobs"),
        Group(
            "pg_append_cost",
            append_cost.run_postgres,
            about="the same on PostgreSQL",
            postgres=True,
        ),
        Group(
            "pg_drain_defaults",
            serve_drain.run_defaults,
            ("pgqueuer",),
            "serve drain: PostgreSQL x2 replicas at their defaults, vs pgqueuer at its defaults",
            postgres=True,
        ),
        Group(
            "drain_default", drain.run_default, ("huey_drain",), "(b) drain at serve's default concurrency"
        ),
        # Celery on Redis (durable: appendfsync always, acks late), the baseline of e2e at the
        # server's defaults (and, inside the trickle group, of the trickle).
        Group("celery", celery_bench.run, about="baseline: Celery 5 on Redis, enqueue, drain, e2e"),
        Group("e2e_defaults", e2e.run_defaults, ("celery",), "(c) e2e with `serve` at its defaults"),
        # DESIGN §11: fair share.
        Group("starved_wait", starved.run, about="one owner's job behind another's 5,000 vs an idle queue"),
        # Retention (serve --retention): deleting never blocks claims.
        Group("retention", retention.run, about="claim p99 while a sweep deletes 100,000 jobs vs idle"),
        Group(
            "pg_retention",
            retention.run_postgres,
            about="the same on PostgreSQL",
            postgres=True,
        ),
        # AdminService (DESIGN §14): a bulk action never holds up claims.
        Group(
            "bulk_cancel",
            bulk_cancel.run,
            about="claim p99 while BulkCancel walks 20,000 queued jobs vs idle (PostgreSQL)",
            postgres=True,
        ),
        # DESIGN §18: graphs of jobs.
        Group(
            "graphs",
            graphs.run,
            about="chain of 1,000 (link latency); 100 diamonds of 100 vs 10,000 independent; release costs",
        ),
        Group(
            "pg_graphs",
            graphs.run_postgres,
            about="the chain and the release costs on PostgreSQL",
            postgres=True,
        ),
        # DESIGN §17: the owner's feed, one Subscribe stream in the users' shapes.
        Group(
            "feed",
            feed.run,
            about="Subscribe: live lag (300 tickers on one beat), 1,000,000-event replay, drain cost",
        ),
        # DESIGN §13: the drain's exit, idle and past the grace (the tests bound it loosely).
        Group(
            "shutdown", shutdown.run, about="serve's signal-to-exit: idle, and beyond a busy drain's grace"
        ),
    )


GROUPS = _groups()
GROUP_NAMES = tuple(group.name for group in GROUPS)


def select(only: list[str] | None, uvloop: bool = True, postgres: bool = True) -> list[Group]:
    """The groups to run: `only` (default all, less uvloop and the PostgreSQL groups when they
    are off) plus what they need, in suite order."""
    wanted = set(
        only
        or (
            group.name
            for group in GROUPS
            if (uvloop or group.name != "uvloop") and (postgres or not group.postgres)
        )
    )
    by_name = {group.name: group for group in GROUPS}
    stack = list(wanted)
    while stack:
        for need in by_name[stack.pop()].needs:
            if need not in wanted:
                wanted.add(need)
                stack.append(need)
    return [group for group in GROUPS if group.name in wanted]


def run_suite(
    rounds: int,
    sizes: Sizes,
    only: list[str] | None,
    emitter: Emitter,
    uvloop: bool = True,
    keep: bool = False,
    postgres: bool = True,
) -> int:
    """Run everything; returns the exit status (1 if any group crashed)."""
    groups = select(only, uvloop, postgres)
    began = time.monotonic()
    crashed = 0
    root = Path(tempfile.mkdtemp(prefix="leasehold-bench-"))
    cluster = BenchPostgres()
    try:
        templates = Templates(root)
        for number in range(1, rounds + 1):
            for group in groups:
                directory = root / f"r{number}-{group.name}"
                directory.mkdir()
                ctx = RoundContext(number, sizes, templates, directory, cluster)
                progress(f"round {number}/{rounds}: {group.name}")
                if not _run_group(group, ctx, emitter):
                    crashed += 1
                    progress(f"round {number}: {group.name} CRASHED (logs kept in {directory})")
                elif not keep:
                    shutil.rmtree(directory, ignore_errors=True)
        records = evaluate(emitter.lines, {group.name for group in groups})
        for record in records:
            emitter.emit(record)
        wall = time.monotonic() - began
        emitter.emit(
            {
                "kind": "summary",
                "rounds": rounds,
                "groups": [g.name for g in groups],
                "wall_seconds": round(wall, 1),
                "crashed": crashed,
            }
        )
        progress(
            f"done in {wall:.0f} s ({rounds} round{'s' if rounds != 1 else ''})\n\n"
            + table(records, emitter.lines)
        )
    finally:
        procs.kill_all()
        cluster.close()
        if crashed or keep:
            progress(f"work directory kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if crashed else 0


def _run_group(group: Group, ctx: RoundContext, emitter: Emitter) -> bool:
    began = time.monotonic()
    try:
        for item in group.run(ctx):
            _emit_item(item, ctx.number, emitter)
    except FigureSkipped as skip:
        emitter.emit({"kind": "skipped", "figure": group.name, "round": ctx.number, "reason": str(skip)})
    except Exception as exc:
        emitter.emit(
            {
                "kind": "error",
                "group": group.name,
                "round": ctx.number,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
            }
        )
        return False
    finally:
        procs.kill_all()
    progress(f"  {group.name} took {time.monotonic() - began:.1f} s")
    return True


def _emit_item(item: RoundItem, number: int, emitter: Emitter) -> None:
    if isinstance(item, Measurement):
        line: dict[str, Any] = item.line(number)
        emitter.emit(line)
        progress(f"  {item.figure} = {item.value:.4g} {item.unit}")
    elif isinstance(item, Skipped):
        for figure in item.figures:
            emitter.emit({"kind": "skipped", "figure": figure, "round": number, "reason": item.reason})
        progress(f"  skipped {', '.join(item.figures)}: {item.reason}")

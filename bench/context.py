"""What a figure module gets for one round: sizes, the run's templates and a fresh directory.

Sizes are one frozen value with a full and a `--quick` preset, so every figure module reads its
numbers from one place and the smoke test exercises the same code paths at toy sizes.
Templates are seeded lazily, once per bench run, in the run's temporary directory; a figure
copies the one it needs for every round. The PostgreSQL cluster is one per run too, and starts
only when a group asks for it (bench.postgres).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Measurement, copy_database, progress, sqlite_url
from bench.postgres import BenchPostgres
from bench.procs import run_child


@dataclass(frozen=True)
class Sizes:
    enqueue_concurrency: tuple[int, ...] = (1, 16, 64)
    enqueue_warmup_seconds: float = 1.0
    enqueue_window_seconds: float = 3.0
    huey_drain_tasks: int = 5_000
    drain_jobs: int = 10_000
    drain_concurrency: int = 64
    drain_info_concurrency: int = 2
    drain_info_jobs: int = 2_000  # concurrency 2 is slow and only informational
    e2e_jobs: int = 10_000
    e2e_server_concurrency: int = 64
    e2e_client_concurrency: int = 64
    trickle_count: int = 200
    trickle_interval: float = 0.020
    replay_events: int = 10_000
    live_jobs: int = 100
    live_watchers_per_job: int = 10
    live_watcher_processes: int = 2
    live_seconds: float = 10.0
    live_interval: float = 0.5
    live_settle_seconds: float = 2.0
    claim_few: int = 1_000
    claim_many: int = 100_000
    claim_pairs: int = 500
    # DESIGN §11: the many-queued claim with its jobs spread over this many owners, and the
    # drain with fairness at work (its jobs spread over drain_owners)
    claim_owners: int = 1_000
    drain_owners: int = 100
    # the starved owner: one job enqueued behind starved_backlog running-and-queued jobs of
    # another owner (each taking starved_job_seconds), against the same job on an idle queue
    starved_backlog: int = 5_000
    starved_job_seconds: float = 0.200
    starved_samples: int = 50
    rss_queued: int = 100_000
    rss_watchers: int = 1_000
    rss_settle_seconds: float = 3.0
    # DESIGN §13: the server's RSS with this many idle WatchEvents streams open
    watch_streams: int = 2_000
    watch_streams_settle_seconds: float = 3.0
    # PostgreSQL: serve processes draining a pre-seeded queue (SQLite, PostgreSQL, pgqueuer)
    serve_drain_jobs: int = 10_000
    pg_replicas: tuple[int, ...] = (1, 3)
    pgqueuer_batch_size: int = 10  # pgqueuer's default (`pgq run --batch-size`)
    # PostgreSQL: cross-replica event delay (tickers on replica B, watchers on replica A)
    cross_jobs: int = 20
    cross_watchers_per_job: int = 1
    cross_seconds: float = 10.0
    cross_interval: float = 0.2
    cross_settle_seconds: float = 2.0
    # remote workers (DESIGN §10): a waiting Claim's wake-up, one job at a time
    claim_wakeup_count: int = 200
    claim_wakeup_warmups: int = 3
    claim_wakeup_gap: float = 0.020
    claim_wakeup_wait_seconds: float = 30.0
    # remote workers: the same no-op drain through `leasehold worker` processes (remote live lag
    # reuses the live_* sizes above, so it is the in-process case with the handlers moved out)
    remote_drain_jobs: int = 10_000
    remote_drain_workers: tuple[int, ...] = (1, 2)
    # DESIGN §15: e2e through BatchEnqueue, `batch_e2e_batch` jobs a call from several clients
    batch_e2e_jobs: int = 10_000
    batch_e2e_batch: int = 100
    batch_e2e_clients: int = 8
    # live lag under load (bench.figures.load_lag): N tickers with one watcher each, as
    # (figure label, jobs); --quick keeps the labels at toy counts
    load_lag_cases: tuple[tuple[str, int], ...] = (("10", 10), ("300", 300), ("1000", 1_000))
    remote_load_lag_case: tuple[str, int] = ("300", 300)
    load_lag_seconds: float = 2.0  # like example.sleep: 2 s ...
    load_lag_interval: float = 0.2  # ... in 10 progress steps
    load_lag_settle_seconds: float = 2.0
    # live lag in a burst (bench.figures.burst_lag): (label, jobs, owners)
    burst_lag_cases: tuple[tuple[str, int, int], ...] = (("300", 300, 1), ("1000x20", 1_000, 20))
    # jobs appending one event vs no-op jobs, drained by one `serve --concurrency 64`
    append_cost_jobs: int = 10_000
    # the Celery-on-Redis baseline: tasks enqueued with no worker up, then drained (its end to
    # end and trickle reuse e2e_jobs and the trickle_* sizes)
    celery_tasks: int = 5_000
    # retention (bench.figures.retention): claim(limit=1) latency with nothing else running vs
    # while a sweep deletes `retention_expired` finished jobs; `retention_idle_claims` timed
    # claims for the idle figure, and a queue deep enough to keep claiming for the whole sweep
    retention_expired: int = 100_000
    retention_queued: int = 120_000
    retention_idle_claims: int = 2_000
    # bulk_cancel (bench.figures.bulk_cancel): claim(limit=1) latency with nothing else running
    # vs while AdminService's bulk cancel walks `bulk_cancel_jobs` queued jobs, on PostgreSQL
    bulk_cancel_jobs: int = 20_000
    bulk_cancel_queued: int = 20_000
    bulk_cancel_idle_claims: int = 2_000
    # graphs of jobs (bench.figures.graphs, DESIGN §18): a chain of `graphs_chain` jobs (one
    # BatchEnqueue, so at most 1,000); `graphs_diamonds` diamonds of `graphs_diamond_size` jobs
    # against as many independent jobs; the completing transaction of a parent with
    # `graphs_fanout` children, of each of `graphs_fanin` parents of one child (that many times
    # over), and of `graphs_plain_succeeds` jobs nothing waits for
    graphs_chain: int = 1_000
    graphs_diamonds: int = 100
    graphs_diamond_size: int = 100
    graphs_fanout: int = 10_000
    graphs_fanin: int = 100
    graphs_fanin_repeats: int = 10
    graphs_plain_succeeds: int = 100
    # shutdown (bench.figures.shutdown): signal-to-exit of an idle server and of one whose
    # handler outlasts `shutdown_grace_seconds`, each the median of this many fresh servers
    shutdown_samples: int = 5
    shutdown_grace_seconds: float = 2.0
    # the owner's feed (bench.figures.feed, DESIGN §17): live lag of one Subscribe stream over
    # `feed_lag_jobs` tickers appending every `feed_lag_interval` on one beat for
    # `feed_lag_seconds`; catch-up replay of a feed of `feed_replay_events` events (the target's
    # size), `feed_replay_events_per_job` to a job; a drain of `feed_write_cost_jobs` appending
    # jobs with a subscriber and without
    feed_lag_jobs: int = 300
    feed_lag_interval: float = 0.2
    feed_lag_seconds: float = 10.0
    feed_lag_settle_seconds: float = 2.0
    feed_replay_events: int = 1_000_000
    feed_replay_events_per_job: int = 5
    feed_write_cost_jobs: int = 10_000


FULL = Sizes()
QUICK = Sizes(
    enqueue_warmup_seconds=0.3,
    enqueue_window_seconds=1.0,
    huey_drain_tasks=500,
    drain_jobs=1_000,
    drain_info_jobs=300,
    e2e_jobs=1_000,
    trickle_count=50,
    replay_events=1_000,
    live_jobs=10,
    live_seconds=2.0,
    live_settle_seconds=0.5,
    claim_few=500,
    claim_many=5_000,
    claim_pairs=100,
    claim_owners=50,
    drain_owners=10,
    starved_backlog=300,
    starved_samples=5,
    rss_queued=5_000,
    rss_watchers=100,
    rss_settle_seconds=1.0,
    watch_streams=200,
    watch_streams_settle_seconds=0.5,
    serve_drain_jobs=1_000,
    cross_jobs=10,
    cross_seconds=2.0,
    cross_settle_seconds=0.5,
    claim_wakeup_count=10,
    remote_drain_jobs=200,
    batch_e2e_jobs=1_000,
    load_lag_cases=(("10", 3), ("300", 6), ("1000", 9)),
    remote_load_lag_case=("300", 6),
    load_lag_seconds=1.0,
    load_lag_settle_seconds=0.5,
    burst_lag_cases=(("300", 20, 1), ("1000x20", 40, 20)),
    append_cost_jobs=500,
    celery_tasks=300,
    retention_expired=2_000,
    retention_queued=3_000,
    retention_idle_claims=200,
    bulk_cancel_jobs=1_000,
    bulk_cancel_queued=2_000,
    bulk_cancel_idle_claims=200,
    shutdown_samples=1,
    shutdown_grace_seconds=0.5,
    graphs_chain=50,
    graphs_diamonds=10,
    graphs_diamond_size=20,
    graphs_fanout=500,
    graphs_fanin=20,
    graphs_fanin_repeats=2,
    graphs_plain_succeeds=20,
    feed_lag_jobs=10,
    feed_lag_seconds=2.0,
    feed_lag_settle_seconds=0.5,
    feed_replay_events=5_000,
    feed_write_cost_jobs=500,
)


class Templates:
    """Seeded-once databases, keyed by what they hold."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._made: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _once(self, key: str, make: Callable[[Path], Any]) -> Any:
        with self._lock:
            if key not in self._made:
                progress(f"seeding template {key} (once per run)")
                self._made[key] = make(self.directory)
            return self._made[key]

    def jobs(self, kind: str, count: int, owners: int = 1) -> Path:
        """A checkpointed database holding `count` queued jobs of `kind`, dealt in turn to
        `owners` owners (one: the bench owner)."""
        key = f"jobs-{kind}-{count}" + (f"-owners{owners}" if owners > 1 else "")

        def make(directory: Path) -> Path:
            path = directory / f"{key}.db"
            run_child(
                directory,
                f"seed-{key}",
                "bench.seed:seed_jobs",
                {"database": str(path), "kind": kind, "count": count, "owners": owners},
                timeout=1800,
            )
            return path

        result: Path = self._once(key, make)
        return result

    def event_log(self, events: int) -> tuple[Path, str]:
        """A database with one succeeded job whose log holds `events` handler events."""
        key = f"events-{events}"

        def make(directory: Path) -> tuple[Path, str]:
            path = directory / f"{key}.db"
            result = run_child(
                directory,
                f"seed-{key}",
                "bench.seed:seed_event_log",
                {"database": str(path), "events": events},
                timeout=600,
            )
            return path, str(result["job_id"])

        made: tuple[Path, str] = self._once(key, make)
        return made

    def feed(self, events: int, per_job: int) -> Path:
        """A database whose one owner's feed holds `events` events, `per_job` to each succeeded
        job (bench.seed.seed_feed)."""
        key = f"feed-{events}-{per_job}"

        def make(directory: Path) -> Path:
            path = directory / f"{key}.db"
            run_child(
                directory,
                f"seed-{key}",
                "bench.seed:seed_feed",
                {"database": str(path), "jobs": events // per_job, "events_per_job": per_job},
                timeout=1800,
            )
            return path

        result: Path = self._once(key, make)
        return result

    def expired_jobs(self, expired: int, queued_kind: str, queued: int) -> Path:
        """A checkpointed database holding `expired` succeeded jobs that finished long ago (see
        bench.seed.seed_expired_jobs), then `queued` queued jobs of `queued_kind`."""
        key = f"expired-{expired}-{queued_kind}-{queued}"

        def make(directory: Path) -> Path:
            path = directory / f"{key}.db"
            run_child(
                directory,
                f"seed-{key}",
                "bench.seed:seed_expired_jobs",
                {
                    "database_url": sqlite_url(path),
                    "expired": expired,
                    "queued_kind": queued_kind,
                    "queued": queued,
                },
                timeout=1800,
            )
            return path

        result: Path = self._once(key, make)
        return result

    def huey_tasks(self, count: int) -> Path:
        from bench.baselines import huey_bench

        made: Path = self._once(f"huey-{count}", lambda directory: huey_bench.make_template(directory, count))
        return made


@dataclass
class RoundContext:
    number: int
    sizes: Sizes
    templates: Templates
    directory: Path  # fresh for every group and round
    postgres: BenchPostgres  # the run's cluster, started by the first group that asks

    def copy(self, template: Path, name: str) -> Path:
        return copy_database(template, self.directory / name)


@dataclass(frozen=True)
class Skipped:
    """Yielded by a figure module instead of a Measurement when a figure cannot run here."""

    figures: tuple[str, ...]
    reason: str


RoundItem = Measurement | Skipped

"""Smoke test of the benchmark suite: `python -m bench --quick` runs every figure and prints every
target line, well-formed.

It runs the suite as a subprocess from the repository root, exactly as docs/performance.md tells a person
to, at toy sizes for one round. It asserts the shape of the output (each figure measured; each
target evaluated; every number finite and positive), never that a target passes: a benchmark is
a measurement, and a slow CI machine must not turn it red.

The PostgreSQL groups need PostgreSQL's server binaries. Without them the run leaves those
groups out (`--no-postgres`) and `test_postgres_groups_ran` says so loudly (skipped, or failed
under LEASEHOLD_TESTS_STRICT=1), as the rest of the test suite does for PostgreSQL.

The Celery baseline needs Debian's redis-server (and the bench extra's celery[redis]); .ci/run
installs it. Without it the `celery` group reports each of its figures as skipped, with what to
install, and `test_celery_group_ran` says so as loudly as the PostgreSQL test does.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.baselines import celery_bench
from bench.figures import node_drain
from bench.suite import GROUPS
from bench.targets import REPORT, TARGETS
from tests.postgres_cluster import find_bin_dir
from tests.support import require

REPO_ROOT = Path(__file__).resolve().parents[2]
# A bound on the run ending, not a figure: a few minutes on a quiet machine, and a CI machine
# busy with other work can stretch every group several times over. A run that hangs still fails.
RUN_TIMEOUT = 1500

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT + 60)]

FIGURES = {
    "baseline.grpc_unary.c1",
    "baseline.grpc_unary.c16",
    "baseline.grpc_unary.c64",
    "leasehold.enqueue.c1",
    "leasehold.enqueue.c16",
    "leasehold.enqueue.c64",
    "baseline.huey.drain",
    "leasehold.drain.c64",
    "leasehold.drain.c2",
    "leasehold.e2e",
    "baseline.huey.trickle.p50",
    "baseline.huey.trickle.p95",
    "baseline.huey.trickle.p99",
    "leasehold.trickle.p50",
    "leasehold.trickle.p95",
    "leasehold.trickle.p99",
    "leasehold.trickle.start.p50",
    "leasehold.trickle.start.p99",
    "baseline.grpc_stream",
    "leasehold.replay",
    "leasehold.live_lag.p50",
    "leasehold.drain.owners",
    "leasehold.claim.many_owners",
    "leasehold.starved_wait.p50",
    "leasehold.idle_wait.p50",
    "leasehold.live_lag.p99",
    "baseline.raw_sqlite.few",
    "baseline.raw_sqlite.many",
    "leasehold.claim.few",
    "leasehold.claim.many",
    "leasehold.peak_rss",
    "leasehold.watch_streams.rss",
    "leasehold.watch_streams.kb_per_stream",
    # (h): uvloop comes with the test extra, so these are measured, not skipped.
    "baseline.grpc_unary.c64.uvloop",
    "leasehold.enqueue.c64.uvloop",
    "leasehold.drain.c64.uvloop",
    "leasehold.e2e.uvloop",
    # Remote workers (DESIGN §10): WorkerService's long poll and `leasehold worker`.
    "leasehold.claim_wakeup.p50",
    "leasehold.claim_wakeup.p95",
    "leasehold.claim_wakeup.p99",
    "leasehold.cancel_push.p50",
    "leasehold.cancel_push.p95",
    "leasehold.cancel_push.p99",
    "leasehold.remote_drain.in_process",
    "leasehold.remote_drain.w1",
    "leasehold.remote_drain.w2",
    # The TypeScript SDK's worker (DESIGN §22), against in-process and a hand-written Node worker
    # (measured when Node.js and the packages' node_modules are there, else reported as skipped).
    "leasehold.node_drain.in_process",
    "leasehold.node_drain.unary_w1",
    "leasehold.node_drain.ts_w1",
    "leasehold.node_drain.ts_w2",
    "leasehold.remote_live_lag.p50",
    "leasehold.remote_live_lag.p99",
    # DESIGN §15: e2e through BatchEnqueue.
    "leasehold.batch_e2e",
    # DESIGN §20: live lag of jobs enqueued and watched at once from one client process.
    "leasehold.burst_lag.300.p50",
    "leasehold.burst_lag.300.p99",
    "leasehold.burst_lag.1000x20.p50",
    "leasehold.burst_lag.1000x20.p99",
    # `serve --processes` 1 and 2, same round.
    "leasehold.processes.drain.n1",
    "leasehold.processes.drain.n2",
    "leasehold.processes.enqueue.n1",
    "leasehold.processes.enqueue.n2",
    "leasehold.processes.burst_lag.n1.p50",
    "leasehold.processes.burst_lag.n1.p99",
    "leasehold.processes.burst_lag.n2.p50",
    "leasehold.processes.burst_lag.n2.p99",
    # Realistic load: many jobs with one watcher each; jobs appending one event vs no-op jobs.
    "leasehold.load_lag.10.p50",
    "leasehold.load_lag.10.p99",
    "leasehold.load_lag.300.p50",
    "leasehold.load_lag.300.p99",
    "leasehold.load_lag.1000.p50",
    "leasehold.load_lag.1000.p99",
    "leasehold.remote_load_lag.300.p50",
    "leasehold.remote_load_lag.300.p99",
    "leasehold.append_cost.sqlite.noop",
    "leasehold.append_cost.sqlite.append",
    "leasehold.drain.default",
    # Celery on Redis (measured when redis-server is installed, else reported as skipped), and
    # the end to end at the server's defaults that is divided by Celery's.
    "baseline.celery.enqueue",
    "baseline.celery.drain",
    "baseline.celery.e2e",
    "baseline.celery.trickle.p50",
    "baseline.celery.trickle.p95",
    "baseline.celery.trickle.p99",
    "leasehold.e2e.defaults",
    # Retention: claim latency idle and while a sweep deletes the expired jobs, and the sweep.
    "leasehold.retention.idle_claim.p99",
    "leasehold.retention.claim.p99",
    "leasehold.retention.sweep",
    # The drain's exit (DESIGN §13): idle, and beyond a busy server's grace.
    "leasehold.shutdown.idle",
    "leasehold.shutdown.beyond_grace",
    # Graphs of jobs (DESIGN §18): a chain's links, diamonds against independent jobs, and what
    # releasing children costs the parent's transaction.
    "leasehold.graphs.chain.p50",
    "leasehold.graphs.chain.p99",
    "leasehold.graphs.chain.handler.p50",
    "leasehold.graphs.chain.handler.p99",
    "leasehold.graphs.independent",
    "leasehold.graphs.diamonds",
    "leasehold.graphs.sqlite.plain",
    "leasehold.graphs.sqlite.fanin",
    "leasehold.graphs.sqlite.fanin_last",
    "leasehold.graphs.sqlite.fanout",
    # The owner's feed (DESIGN §17): live lag of one Subscribe stream, catch-up replay against
    # the no-op server, and a drain with a subscriber and without.
    "leasehold.feed.lag.p50",
    "leasehold.feed.lag.p99",
    "baseline.grpc_feed_stream",
    "leasehold.feed.replay",
    "leasehold.feed.write.alone",
    "leasehold.feed.write.subscribed",
}
CELERY_FIGURES = {name for name in FIGURES if name.startswith("baseline.celery.")}
NODE_FIGURES = set(node_drain.NODE_FIGURES)

# Measured by the PostgreSQL groups.
PG_FIGURES = {
    "baseline.pgqueuer.drain",
    "leasehold.serve_drain.sqlite.r1",
    "leasehold.serve_drain.pg.r1",
    "leasehold.serve_drain.pg.r3",
    "leasehold.pg.trickle.p50",
    "leasehold.pg.trickle.p95",
    "leasehold.pg.trickle.p99",
    "leasehold.pg.trickle.start.p50",
    "leasehold.pg.trickle.start.p99",
    "leasehold.pg.cross_replica_lag.p50",
    "leasehold.pg.cross_replica_lag.p99",
    "leasehold.pg.claim_wakeup.p50",
    "leasehold.pg.claim_wakeup.p95",
    "leasehold.pg.claim_wakeup.p99",
    "leasehold.append_cost.pg.noop",
    "leasehold.append_cost.pg.append",
    "leasehold.serve_drain.pg.r2.defaults",
    "leasehold.pg.retention.idle_claim.p99",
    "leasehold.pg.retention.claim.p99",
    "leasehold.pg.retention.sweep",
    # AdminService.BulkCancel: claim latency idle and while it walks the queued jobs, and the walk.
    "leasehold.pg.bulk_cancel.idle_claim.p99",
    "leasehold.pg.bulk_cancel.claim.p99",
    "leasehold.pg.bulk_cancel.walk",
    # Graphs of jobs on PostgreSQL.
    "leasehold.graphs.pg.chain.p50",
    "leasehold.graphs.pg.chain.p99",
    "leasehold.graphs.pg.chain.handler.p50",
    "leasehold.graphs.pg.chain.handler.p99",
    "leasehold.graphs.pg.plain",
    "leasehold.graphs.pg.fanin",
    "leasehold.graphs.pg.fanin_last",
    "leasehold.graphs.pg.fanout",
}


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def _measured(value: Any, unit: str) -> bool:
    """A rate or size is above zero; a latency may be zero (a Claim that returns before
    the Enqueue's own answer waited no time after it), never below."""
    return _positive(value) or (unit == "ms" and value == 0)


HAVE_POSTGRES = find_bin_dir() is not None
PG_GROUPS = {group.name for group in GROUPS if group.postgres}
CELERY_MISSING = celery_bench.missing()  # why the Celery baseline cannot run here, or None
CELERY_TARGETS = {target.name for target in TARGETS if {target.figure, target.baseline} & CELERY_FIGURES}
NODE_MISSING = node_drain.missing()  # why the Node workers cannot run here, or None
NODE_TARGETS = {target.name for target in TARGETS if {target.figure, target.baseline} & NODE_FIGURES}
EXPECTED_FIGURES = (
    (FIGURES | PG_FIGURES if HAVE_POSTGRES else FIGURES)
    - (CELERY_FIGURES if CELERY_MISSING else set())
    - (NODE_FIGURES if NODE_MISSING else set())
)
EXPECTED_TARGETS = [
    target
    for target in TARGETS
    if (HAVE_POSTGRES or target.group not in PG_GROUPS)
    and not (CELERY_MISSING and target.name in CELERY_TARGETS)
    and not (NODE_MISSING and target.name in NODE_TARGETS)
]


@pytest.fixture(scope="module")
def quick_run() -> tuple[list[dict[str, Any]], str]:
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", *([] if HAVE_POSTGRES else ["--no-postgres"])],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert completed.returncode == 0, f"exit {completed.returncode}\n{completed.stderr[-4000:]}"
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    return lines, completed.stderr


def test_every_figure_is_measured(quick_run: tuple[list[dict[str, Any]], str]) -> None:
    lines, _ = quick_run
    assert not [line for line in lines if line["kind"] == "error"]
    figures = {line["figure"]: line for line in lines if line["kind"] == "figure"}
    skipped = {line["figure"] for line in lines if line["kind"] == "skipped"}
    missing = EXPECTED_FIGURES - set(figures)
    assert not missing, f"missing figures: {sorted(missing)}"
    assert not (skipped & EXPECTED_FIGURES), f"skipped: {sorted(skipped & EXPECTED_FIGURES)}"
    for name, line in figures.items():
        assert line["round"] == 1
        assert _measured(line["value"], line["unit"]), line
        assert line["unit"] and line["side"] in ("baseline", "leasehold"), line
        assert isinstance(line["params"], dict), line
        assert name.startswith(line["side"]), line


def test_every_target_is_evaluated(quick_run: tuple[list[dict[str, Any]], str]) -> None:
    lines, stderr = quick_run
    targets = {line["target"]: line for line in lines if line["kind"] == "target"}
    units = {line["figure"]: line["unit"] for line in lines if line["kind"] == "figure"}
    assert set(targets) == {target.name for target in EXPECTED_TARGETS}
    for target in EXPECTED_TARGETS:
        line = targets[target.name]
        unit = "ratio" if target.ratio else units[target.figure]
        if target.op == REPORT:  # no goal: shown, never judged
            assert line["status"] == REPORT and line["pass"] is None, line
        else:
            assert line["status"] in {"pass", "fail"}, line
            assert line["pass"] is (line["status"] == "pass"), line
        assert line["goal"] and line["figure"] == target.figure, line
        assert _measured(line["measured"], unit), line
        assert line["rounds"] and all(_measured(value, unit) for value in line["rounds"]), line
        assert line["figure_values"] and all(
            _measured(value, units[target.figure]) for value in line["figure_values"]
        ), line
        if target.baseline is not None:
            assert line["baseline_values"] and all(
                _measured(v, units[target.baseline]) for v in line["baseline_values"]
            ), line
        assert target.name in stderr  # the human table names it
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["crashed"] == 0


def test_postgres_groups_ran(quick_run: tuple[list[dict[str, Any]], str]) -> None:
    require(
        HAVE_POSTGRES,
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: the PostgreSQL groups' figures",
    )
    lines, _ = quick_run
    summary = lines[-1]
    assert PG_GROUPS <= set(summary["groups"]), summary


def _celery_measured_or_skipped(lines: list[dict[str, Any]]) -> None:
    """Every Celery figure has a figure line, or a `skipped` line whose reason says what to
    install; and so every target divided by one is evaluated, or skipped with that reason."""
    figures = {line["figure"] for line in lines if line["kind"] == "figure"}
    skipped = {line["figure"]: line for line in lines if line["kind"] == "skipped"}
    for name in CELERY_FIGURES:
        if name in figures:
            assert name not in skipped, name
            continue
        assert name in skipped, f"{name}: neither measured nor skipped"
        reason = skipped[name]["reason"]
        assert "apt-get install redis-server" in reason or "pip install" in reason, reason
    targets = {line["target"]: line for line in lines if line["kind"] == "target"}
    for name in CELERY_TARGETS & set(targets):
        line = targets[name]
        assert line["status"] in {"pass", "fail", REPORT} or (
            line["status"] == "skipped" and line["reason"]
        ), line


def test_celery_measured_or_skipped(quick_run: tuple[list[dict[str, Any]], str]) -> None:
    lines, _ = quick_run
    _celery_measured_or_skipped(lines)


def test_celery_group_ran(quick_run: tuple[list[dict[str, Any]], str]) -> None:
    require(CELERY_MISSING is None, f"the Celery baseline: {CELERY_MISSING}")
    lines, _ = quick_run
    figures = {line["figure"] for line in lines if line["kind"] == "figure"}
    assert CELERY_FIGURES <= figures, sorted(CELERY_FIGURES - figures)


def test_celery_without_redis_is_skipped() -> None:
    """A redis-server that is not there makes the group say so, not crash."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "celery", "trickle"],
        cwd=REPO_ROOT,
        env={**os.environ, celery_bench.REDIS_ENV: "/nonexistent/redis-server"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    assert not [line for line in lines if line["kind"] == "error"], lines
    measured = {line["figure"] for line in lines if line["kind"] == "figure"}
    assert "leasehold.trickle.p50" in measured and not measured & CELERY_FIGURES, measured
    skipped = {line["figure"]: line["reason"] for line in lines if line["kind"] == "skipped"}
    assert set(skipped) == CELERY_FIGURES, skipped
    assert all("apt-get install redis-server" in reason for reason in skipped.values()), skipped
    _celery_measured_or_skipped(lines)


def test_node_group_ran(quick_run: tuple[list[dict[str, Any]], str]) -> None:
    """The Node figures are measured, or (without Node.js or the packages' node_modules) each is
    reported as skipped saying what to install."""
    lines, _ = quick_run
    figures = {line["figure"] for line in lines if line["kind"] == "figure"}
    skipped = {line["figure"]: line["reason"] for line in lines if line["kind"] == "skipped"}
    assert "leasehold.node_drain.in_process" in figures
    for name in NODE_FIGURES - figures:
        assert "npm" in skipped.get(name, ""), (name, skipped)
    require(NODE_MISSING is None, f"the Node workers: {NODE_MISSING}")
    assert NODE_FIGURES <= figures, sorted(NODE_FIGURES - figures)

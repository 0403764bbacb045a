"""The graphs group's shapes (bench.figures.graphs): every BatchEnqueue it sends is one the API
accepts, whole graphs per call, each job waiting for what the shape says; and the EXPLAIN
script (bench.explain_graphs) prints a plan and a verdict for every statement of a release.

The group's figures themselves are measured by test_bench_smoke's `--quick` run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from bench import explain_graphs
from bench.figures import graphs
from leasehold._server.api import validation
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.routing import ServedKinds
from leasehold.v1 import jobs_pb2

NOW = datetime(2026, 12, 6, tzinfo=UTC)
DUE = NOW.timestamp() + 5.0


class _Kinds:
    def __contains__(self, kind: object) -> bool:
        return kind in (graphs.NOOP_KIND, graphs.LINK_KIND)

    def kinds(self) -> frozenset[str]:
        return frozenset({graphs.NOOP_KIND, graphs.LINK_KIND})


def accepted(request: jobs_pb2.BatchEnqueueRequest) -> list[NewJob]:
    """The call as the server's validation turns it into jobs (refs resolved to positions)."""
    return validation.new_jobs("bench-owner", request, ServedKinds(_Kinds()), NOW)


def due_items(request: jobs_pb2.BatchEnqueueRequest) -> list[int]:
    return [i for i, item in enumerate(request.requests) if item.HasField("run_at")]


def test_a_chain_is_one_call_each_link_waiting_for_the_one_before() -> None:
    (request,) = graphs.batches(graphs.chain(1_000, graphs.LINK_KIND, DUE), validation.BATCH_ENQUEUE_LIMIT)
    jobs = accepted(request)
    assert len(jobs) == 1_000
    assert [job.depends_on_items for job in jobs] == [(), *((i,) for i in range(999))]
    assert due_items(request) == [0]
    assert jobs[0].run_at is not None and jobs[0].run_at.timestamp() == pytest.approx(DUE, abs=1e-6)


def test_diamonds_go_whole_ten_to_a_call() -> None:
    requests = graphs.batches(
        graphs.diamonds(100, 100, graphs.NOOP_KIND, DUE), validation.BATCH_ENQUEUE_LIMIT
    )
    assert [len(request.requests) for request in requests] == [1_000] * 10
    for request in requests:
        jobs = accepted(request)
        for start in range(0, 1_000, 100):
            diamond = jobs[start : start + 100]
            assert diamond[0].depends_on_items == ()
            assert all(job.depends_on_items == (start,) for job in diamond[1:99])
            assert diamond[99].depends_on_items == tuple(range(start + 1, start + 99))
        assert due_items(request) == list(range(0, 1_000, 100))


def test_independent_jobs_go_in_calls_of_the_same_size_all_due_at_the_gate() -> None:
    requests = graphs.batches(
        graphs.independent(10_000, graphs.NOOP_KIND, DUE), validation.BATCH_ENQUEUE_LIMIT
    )
    assert [len(request.requests) for request in requests] == [1_000] * 10
    for request in requests:
        assert all(not job.depends_on_items for job in accepted(request))
        assert due_items(request) == list(range(1_000))


def test_a_graph_is_never_split_across_calls() -> None:
    requests = graphs.batches(graphs.diamonds(7, 90, graphs.NOOP_KIND, DUE), 200)
    assert [len(request.requests) for request in requests] == [180, 180, 180, 90]
    for request in requests:
        accepted(request)  # every ref names an item of its own call


@pytest.mark.slow
def test_the_explain_script_finds_every_statement_seeking_on_sqlite() -> None:
    """Run as its own process (it sets up logging for itself). Every statement a
    release sends, and retention's, seeks or walks its designed range, both as
    `serve` leaves the file and after ANALYZE: without `seek_by_key_only` the
    children's and parents' reads walk every queued or succeeded job."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.explain_graphs", "--jobs", "16000", "--no-postgres"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = done.stdout
    names = [
        case.name for case in explain_graphs.cases(explain_graphs.Seeded(["r1", "r2"], ["m"] * 10, "s", "b"))
    ]
    for name in names:
        verdicts = re.findall(
            rf"^-- {re.escape(name)}: .*\[(seek|range|SCAN), [\d.]+ ms\]$", out, re.MULTILINE
        )
        # As `serve` leaves the file, and after ANALYZE.
        assert verdicts in (["seek", "seek"], ["range", "range"]), (name, out)
    assert "after ANALYZE" in out

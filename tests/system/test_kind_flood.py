"""Owners inventing kinds cannot break the admin's view: 30 owners each
BatchEnqueue 1,000 kinds of their own (30,000 kinds, every one at the default
--max-kinds-per-owner) under `--remote-kinds 'remote.*'`, against a real
`leasehold serve` on SQLite. /metrics stays small (the invented kinds are one
`other` series), GetQueueStats answers a client with gRPC's default 4 MiB limit
and says it was truncated, `leasehold admin stats` works and the admin's
dashboard overview loads. The next new kind of a full owner is refused."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from leasehold.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from tests.credentials import bearer, token_file
from tests.dashboard.test_serve import Browserless
from tests.support import sqlite_url
from tests.system.helpers import Leasehold, run_cli

pytestmark = pytest.mark.slow

OWNERS = 30
KINDS_PER_OWNER = 1000  # the default --max-kinds-per-owner: each owner ends exactly at it
METRICS_LIMIT = 1024 * 1024
# Kinds of the longest length allowed (128): 30,000 such stats rows would be
# about 4.6 MB, past what a gRPC client accepts by default.
PADDING = "x" * 100


def _batch(owner: int) -> jobs_pb2.BatchEnqueueRequest:
    return jobs_pb2.BatchEnqueueRequest(
        requests=[
            jobs_pb2.EnqueueRequest(
                kind=f"remote.o{owner}.invented-{n}.{PADDING}", payload=struct_pb2.Struct()
            )
            for n in range(KINDS_PER_OWNER)
        ]
    )


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


@pytest.mark.timeout(300)
def test_thirty_thousand_invented_kinds_leave_metrics_stats_cli_and_dashboard_working(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    owners = [f"owner:flooder-{n}" for n in range(OWNERS)]
    path, tokens = token_file(tmp_path / "tokens", "admin", *owners)
    admin_token, owner_tokens = tokens[0], tokens[1:]
    server = processes(
        Leasehold.serve(
            sqlite_url(tmp_path),
            *("--auth", "token", "--token-file", str(path), "--remote-kinds", "remote.*"),
            *("--metrics-listen", "127.0.0.1:0", "--dashboard-listen", "127.0.0.1:0"),
        )
    )
    port = server.start()
    started = server.started.record

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # default options: 4 MiB to receive
        jobs = jobs_pb2_grpc.JobServiceStub(channel)

        def flood(owner: int) -> int:
            answer = jobs.BatchEnqueue(_batch(owner), metadata=bearer(owner_tokens[owner]), timeout=120)
            return len(answer.responses)

        with ThreadPoolExecutor(4) as pool:
            assert sum(pool.map(flood, range(OWNERS))) == OWNERS * KINDS_PER_OWNER

        # Every owner is at its limit: one more new kind is refused, a known one is not.
        with pytest.raises(grpc.RpcError) as refused:
            jobs.Enqueue(
                jobs_pb2.EnqueueRequest(kind="remote.one-too-many", payload=struct_pb2.Struct()),
                metadata=bearer(owner_tokens[0]),
            )
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max-kinds-per-owner" in (refused.value.details() or "")
        again = jobs_pb2.EnqueueRequest(kind=f"remote.o0.invented-0.{PADDING}", payload=struct_pb2.Struct())
        assert jobs.Enqueue(again, metadata=bearer(owner_tokens[0])).created

        stats = admin_pb2_grpc.AdminServiceStub(channel).GetQueueStats(
            admin_pb2.GetQueueStatsRequest(), metadata=bearer(admin_token), timeout=60
        )
    print(f"GetQueueStats with {OWNERS * KINDS_PER_OWNER} kinds: {stats.ByteSize()} bytes")
    assert stats.truncated
    assert len(stats.kinds) == 1000
    assert stats.ByteSize() < 1024 * 1024

    metrics = _get(str(started["metrics"]))
    print(f"/metrics with {OWNERS * KINDS_PER_OWNER} kinds: {len(metrics)} bytes")
    assert len(metrics) < METRICS_LIMIT
    text = metrics.decode()
    assert 'leasehold_jobs_enqueued_total{kind="other"} 30001.0' in text
    assert "invented" not in text

    cli = run_cli(
        "admin", "stats", env={"LEASEHOLD_SERVER": f"127.0.0.1:{port}", "LEASEHOLD_TOKEN": admin_token}
    )
    assert cli.returncode == 0, cli.stderr
    assert "truncated" in cli.stdout

    web = Browserless(str(started["dashboard"]))
    status, landed, page = web.sign_in(admin_token)
    assert (status, landed.removeprefix(web.base)) == (200, "/overview"), page[:2000]
    assert 'id="truncated"' in page
    status, _, _ = web.get("/overview")
    assert status == 200

"""ListWorkers with a real `leasehold worker` process against a real `leasehold
serve` (token auth): the worker is listed with the kinds it claims, the jobs it
runs counted as held and its latest heartbeat, through the Python client and
`leasehold admin workers`; the server's own runtime is no remote worker, and an
owner is refused as for every admin call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest

from leasehold.client import Client
from leasehold.v1 import admin_pb2, jobs_pb2
from tests.api.helpers import error_reason
from tests.remote.support import REMOTE_HANDLERS, wait_started
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import TEST_HANDLERS, Leasehold, run_cli

pytestmark = pytest.mark.slow

WAIT = 30.0
WORKER_ID = "remote-1"


async def _event(client: Client, job_id: str, event_type: str) -> None:
    """Until the job has an event of `event_type` (remote.block reports
    `progress` once its handler runs)."""
    async with asyncio.timeout(WAIT):
        async for event in client.watch(job_id):
            if event.type == event_type:
                return
    raise AssertionError(f"job {job_id} ended without a {event_type} event")


async def _until(
    ops: Client, check: Callable[[admin_pb2.ListWorkersResponse], bool]
) -> admin_pb2.ListWorkersResponse:
    """ListWorkers again until `check` holds, for at most WAIT seconds."""
    async with asyncio.timeout(WAIT):
        while not check(found := await ops.admin.workers()):
            await asyncio.sleep(0.05)
    return found


async def test_a_worker_process_is_listed_with_its_kinds_and_the_jobs_it_runs(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    server, _, (alice_token, admin_token, worker_token) = Leasehold.serve_with_tokens(
        tmp_path,
        ("owner:alice", "admin", "worker"),
        *("--remote-kinds", "remote.*", "--handlers", *TEST_HANDLERS, "--lease-seconds", "6"),
    )
    port = processes(server).start()
    worker = processes(
        Leasehold(
            "worker",
            "--server",
            f"127.0.0.1:{port}",
            "--handlers",
            REMOTE_HANDLERS,
            "--kinds",
            "remote.record",
            "remote.block",
            "--concurrency",
            "4",
            "--worker-id",
            WORKER_ID,
            env={"LEASEHOLD_WORKER_TOKEN": worker_token, RECORD_DIR_ENV: str(tmp_path)},
        )
    )
    wait_started(worker.launch())
    target = f"127.0.0.1:{port}"
    gate = tmp_path / "gate"
    started = datetime.now(UTC).replace(microsecond=0)
    async with Client(target, token=alice_token) as alice, Client(target, token=admin_token) as ops:
        local = (await alice.enqueue("example.sleep", {"seconds": 60})).job.id
        blocked = [(await alice.enqueue("remote.block", {"gate": str(gate)})).job.id for _ in range(2)]
        await _event(alice, local, "job.started")
        for job_id in blocked:
            await _event(alice, job_id, "progress")
        listed = await _until(ops, lambda r: any(w.jobs_held == 2 for w in r.workers))

        (remote,) = listed.workers  # the server's in-process runtime holds `local`, and is not listed
        assert (remote.worker_id, list(remote.kinds), remote.jobs_held) == (
            WORKER_ID,
            ["remote.block", "remote.record"],
            2,
        )
        assert started <= remote.last_seen_at.ToDatetime(UTC) <= datetime.now(UTC)
        assert not listed.truncated
        assert (await alice.get(local)).status == jobs_pb2.JOB_STATUS_RUNNING  # by the runtime

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await alice.admin.workers()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_reason(refused.value) == "ADMIN_ROLE_REQUIRED"

        cli_env = {"LEASEHOLD_SERVER": target, "LEASEHOLD_TOKEN": admin_token}
        as_json = run_cli("admin", "workers", "--output", "json", env=cli_env, timeout=60)
        assert as_json.returncode == 0, as_json.stderr
        (line,) = [json.loads(text) for text in as_json.stdout.splitlines()]
        assert [(w["workerId"], w["kinds"], w["jobsHeld"]) for w in line["workers"]] == [
            (WORKER_ID, ["remote.block", "remote.record"], "2")
        ]
        table = run_cli("admin", "workers", env=cli_env, timeout=60)
        assert table.returncode == 0, table.stderr
        header, row = table.stdout.splitlines()
        assert header.split() == ["WORKER", "KINDS", "JOBS", "HELD", "LAST", "SEEN", "CLAIMING"]
        assert row.split()[:3] == [WORKER_ID, "remote.block,remote.record", "2"]
        denied = run_cli("admin", "workers", env={**cli_env, "LEASEHOLD_TOKEN": alice_token}, timeout=60)
        assert denied.returncode == 4 and "PERMISSION_DENIED" in denied.stderr, denied.stderr

        gate.touch()  # the handlers finish: the worker holds nothing, and is still known
        idle = await _until(ops, lambda r: all(w.jobs_held == 0 for w in r.workers))
        assert [(w.worker_id, w.jobs_held) for w in idle.workers] == [(WORKER_ID, 0)]

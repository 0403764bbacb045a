"""`serve` and `leasehold worker` freeze their startup heap (server/gc_tuning.py), so a
full collection no longer walks the objects of every imported module and stops the
event loop for tens of milliseconds, and space out the young collections. Each
process is asked from inside, by a job whose handler reads its own process's freeze
count and young threshold: without the call they are 0 and Python's 700."""

from __future__ import annotations

import asyncio
import sys

import pytest

from leasehold._server.gc_tuning import YOUNG_COLLECTION_THRESHOLD
from leasehold.v1 import jobs_pb2
from tests.remote_worker.fake_server import TOKEN, fake_server
from tests.system.helpers import REPO_ROOT, Client, Leasehold, child_env, wait_until

pytestmark = pytest.mark.slow

PROBE = "tests.system.heap_probe"
# The modules a server imports hold about a hundred thousand tracked objects; a
# process that froze nothing reports 0, and one that froze only a few would not
# have taken the imports with it.
AT_LEAST_FROZEN = 20_000


def test_serve_freezes_its_startup_heap(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url, "--handlers", PROBE))
    port = server.start()
    with Client(port) as client:
        job = client.enqueue("test.heap")

        def ended() -> jobs_pb2.Job | None:
            got = client.get(job.id)
            return got if got.HasField("completed_at") else None

        done = wait_until(ended, 30, "the job ends")
    assert done.result["frozen"] >= AT_LEAST_FROZEN, dict(done.result)
    assert done.result["young_threshold"] == YOUNG_COLLECTION_THRESHOLD


async def test_leasehold_worker_freezes_its_startup_heap() -> None:
    async with fake_server() as (service, address):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "leasehold",
            "worker",
            "--handlers",
            PROBE,
            cwd=REPO_ROOT,
            env=child_env({"LEASEHOLD_WORKER_TOKEN": TOKEN, "LEASEHOLD_SERVER": address}),
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await service.enqueue("test.heap")
            await service.until(lambda: bool(service.named("Complete")), timeout=30)
        finally:
            process.kill()
            await process.wait()
    result = service.named("Complete")[0].request.result
    assert result["frozen"] >= AT_LEAST_FROZEN, dict(result)
    assert result["young_threshold"] == YOUNG_COLLECTION_THRESHOLD

"""A sync handler (`def handler(ctx)`) under `leasehold worker`'s Worker: the same
thread and blocking context as in-process, its writes going over WorkerService."""

from __future__ import annotations

import threading

from leasehold.worker import HandlerRegistry, SyncJobContext
from tests.remote_worker.fake_server import fake_server, running_worker


async def test_a_sync_handler_appends_and_completes_through_the_worker_service() -> None:
    threads: list[str] = []

    def double(ctx: SyncJobContext) -> dict[str, object]:
        threads.append(threading.current_thread().name)
        ctx.raise_if_cancelled()
        ctx.append_event("progress", {"half": True})
        return {"doubled": ctx.payload["n"] * 2}

    registry = HandlerRegistry()
    registry.register("test.double", double)
    async with fake_server() as (service, address):
        async with running_worker(address, registry):
            await service.enqueue("test.double", {"n": 21})
            await service.until(lambda: bool(service.named("Complete")))

    assert [call.method for call in service.writes()] == ["AppendEvent", "Complete"]
    assert service.named("Complete")[0].request.result["doubled"] == 42
    assert threads and threads[0] != threading.main_thread().name

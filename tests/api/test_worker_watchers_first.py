"""A remote write's answer waits for the watchers its commit woke (worker_servicer
`_watchers_first`): the storage writer settles its callers, then hands the events to
the watchers, and the caller's answer (a gRPC send) must not go out ahead of them."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from leasehold._server.api.worker_auth import WorkerAuth
from leasehold._server.api.worker_servicer import WorkerServiceServicer
from leasehold._server.jobs.records import JobEvent, JsonObject, Lease
from leasehold._server.jobs.routing import KindPatterns
from leasehold.v1 import worker_pb2

TOKEN = secrets.token_urlsafe(24)
JOB_ID = "job_" + "0" * 32


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKEN}"),)


class _Repository:
    """Answers an append as the writer does: the caller's future first, then the
    watchers' wake-up, both from one callback on the loop."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.watcher_woken = asyncio.Event()

    async def append_event(self, lease: Lease, event_type: str, payload: JsonObject) -> JobEvent:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[JobEvent] = loop.create_future()
        event = JobEvent(lease.job_id, 3, event_type, payload, None)  # type: ignore[arg-type]

        def settle() -> None:
            answer.set_result(event)
            self.watcher_woken.set()

        loop.call_soon(settle)
        return await answer


async def _watcher(repository: _Repository) -> None:
    await repository.watcher_woken.wait()
    repository.order.append("watcher")


async def test_the_watchers_of_a_commit_run_before_the_append_is_answered() -> None:
    repository = _Repository()
    servicer = WorkerServiceServicer(
        repository,  # type: ignore[arg-type]
        WorkerAuth(TOKEN),
        KindPatterns.parse(["remote.*"]),
        claimer=None,  # type: ignore[arg-type]
        lease_seconds=30.0,
    )
    watcher = asyncio.create_task(_watcher(repository))
    await asyncio.sleep(0)  # the watcher waits
    request = worker_pb2.AppendEventRequest(job_id=JOB_ID, lease_token="t" * 32, type="progress")
    context: Any = _Context()
    response = await servicer.append_event(request.SerializeToString(), context)
    repository.order.append("answer")
    await watcher
    assert response.sequence == 3
    assert repository.order == ["watcher", "answer"]

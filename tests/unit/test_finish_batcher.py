"""FinishBatcher: one Finish in flight, the outcomes that end meanwhile sent
together in the next, each caller answered with its own result or error."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from leasehold._server.jobs.errors import InvalidArgument, LeaseLost, StorageUnavailable
from leasehold._server.remote.finishing import FinishBatcher
from leasehold.v1 import jobs_pb2, worker_pb2


def _outcome(job_id: str) -> worker_pb2.Outcome:
    return worker_pb2.Outcome(complete=worker_pb2.CompleteRequest(job_id=job_id, lease_token="t"))


class _Server:
    """Answers each Finish when told to; records what each call carried."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()
        self.answer: dict[str, worker_pb2.OutcomeResult] = {}
        self.error: grpc.aio.AioRpcError | None = None

    async def send(self, request: worker_pb2.FinishRequest, timeout: float) -> worker_pb2.FinishResponse:
        ids = [outcome.complete.job_id for outcome in request.outcomes]
        self.calls.append(ids)
        await self.release.wait()
        self.release.clear()
        if self.error is not None:
            raise self.error
        return worker_pb2.FinishResponse(
            results=[
                self.answer.get(job_id)
                or worker_pb2.OutcomeResult(
                    job_id=job_id, job=jobs_pb2.Job(id=job_id, status=jobs_pb2.JOB_STATUS_SUCCEEDED)
                )
                for job_id in ids
            ]
        )


async def _until(condition: object) -> None:
    async with asyncio.timeout(5):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0)


async def test_outcomes_ending_while_a_call_is_in_flight_go_together_in_the_next() -> None:
    server = _Server()
    batcher = FinishBatcher(server.send, 10.0)
    first = asyncio.ensure_future(batcher.finish(_outcome("a"), "a"))
    await _until(lambda: len(server.calls) == 1)
    rest = [asyncio.ensure_future(batcher.finish(_outcome(job_id), job_id)) for job_id in "bcd"]
    await asyncio.sleep(0)
    assert len(server.calls) == 1  # one call in flight at a time
    server.release.set()
    assert (await first).id == "a"
    await _until(lambda: len(server.calls) == 2)
    server.release.set()
    assert [job.id for job in await asyncio.gather(*rest)] == ["b", "c", "d"]
    assert server.calls == [["a"], ["b", "c", "d"]]


async def test_each_caller_gets_its_own_answer() -> None:
    server = _Server()
    server.answer["lost"] = worker_pb2.OutcomeResult(job_id="lost", lost=True)
    server.answer["bad"] = worker_pb2.OutcomeResult(
        job_id="bad",
        invalid=worker_pb2.FieldViolation(field="outcomes[1].complete.result", description="too big"),
    )
    batcher = FinishBatcher(server.send, 10.0)
    server.release.set()
    calls = [
        asyncio.ensure_future(batcher.finish(_outcome(job_id), job_id)) for job_id in ("lost", "bad", "ok")
    ]
    lost, bad, ok = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(lost, LeaseLost)
    assert isinstance(bad, InvalidArgument) and bad.field == "outcomes[1].complete.result"
    assert isinstance(ok, jobs_pb2.Job) and ok.status == jobs_pb2.JOB_STATUS_SUCCEEDED


async def test_a_call_that_fails_fails_each_of_its_outcomes_as_its_single_call_would() -> None:
    server = _Server()
    server.error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
    )
    batcher = FinishBatcher(server.send, 10.0)
    server.release.set()
    calls = [asyncio.ensure_future(batcher.finish(_outcome(job_id), job_id)) for job_id in "xy"]
    for call in calls:
        with pytest.raises(StorageUnavailable):
            await call
    # The batcher is not stuck: the next outcome goes out in a call of its own.
    server.error = None
    server.release.set()
    assert (await batcher.finish(_outcome("z"), "z")).id == "z"

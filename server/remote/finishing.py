"""Finishing writes that end together travel together (WorkerService.Finish).

Jobs a worker claimed together tend to end together, and a call per outcome
costs both processes more than the write itself. One call is in flight at a
time: an outcome that arrives while none is goes at once (so a lone job waits
for nothing), and the outcomes that arrive meanwhile go together in the next
one. Each outcome is still fenced by its own lease token and answered on its
own, so a caller sees exactly what its single call would have raised or
returned; a call that fails as a whole (UNAVAILABLE, a deadline) fails each of
its outcomes alike, and the executor's retry of one is answered as the first
was, the server remembering every finishing write it made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from leasehold._server.jobs.errors import InvalidArgument, LeaseLost
from leasehold._server.remote.calls import WorkerServiceError, domain_error
from leasehold.v1 import jobs_pb2, worker_pb2

# The server takes up to 1,000 outcomes in one call.
MAX_OUTCOMES_PER_CALL = 1000

FinishCall = Callable[[worker_pb2.FinishRequest, float], Awaitable[worker_pb2.FinishResponse]]


class FinishBatcher:
    """Sends outcomes through `send` (a Finish call with a timeout), many to a call."""

    def __init__(self, send: FinishCall, timeout_seconds: float) -> None:
        self._send = send
        self._timeout = timeout_seconds
        self._waiting: list[tuple[worker_pb2.Outcome, str, asyncio.Future[jobs_pb2.Job]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def finish(self, outcome: worker_pb2.Outcome, job_id: str) -> jobs_pb2.Job:
        """The job as the outcome left it; LeaseLost, InvalidArgument or the
        call's mapped status as the single call would raise them."""
        answer: asyncio.Future[jobs_pb2.Job] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(_retrieved)
        self._waiting.append((outcome, job_id, answer))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_waiting(), name="leasehold-worker-finish")
        # A caller cancelled while it waits leaves its outcome to be sent: it
        # may already be on its way, and a written outcome is what the server
        # would answer a retry with anyway.
        return await asyncio.shield(answer)

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[:MAX_OUTCOMES_PER_CALL]
                del self._waiting[:MAX_OUTCOMES_PER_CALL]
                await self._send_batch(batch)
        finally:
            self._sender = None

    async def _send_batch(
        self, batch: list[tuple[worker_pb2.Outcome, str, asyncio.Future[jobs_pb2.Job]]]
    ) -> None:
        request = worker_pb2.FinishRequest(outcomes=[outcome for outcome, _, _ in batch])
        try:
            response = await self._send(request, self._timeout)
        except grpc.aio.AioRpcError as error:
            for _, job_id, answer in batch:
                _settle(answer, exception=domain_error(error, job_id))
            return
        except BaseException as error:  # cancelled with the worker: nobody is left to answer
            for _, _, answer in batch:
                _settle(answer, exception=error)
            raise
        for (_, job_id, answer), result in zip(batch, response.results, strict=False):
            if result.lost:
                _settle(answer, exception=LeaseLost(job_id))
            elif result.HasField("invalid"):
                _settle(answer, exception=InvalidArgument(result.invalid.field, result.invalid.description))
            else:
                _settle(answer, job=result.job)
        for _, _, answer in batch[len(response.results) :]:
            _settle(answer, exception=WorkerServiceError(grpc.StatusCode.INTERNAL))


def _settle(
    answer: asyncio.Future[jobs_pb2.Job],
    *,
    job: jobs_pb2.Job | None = None,
    exception: BaseException | None = None,
) -> None:
    if answer.done():
        return
    if exception is not None:
        answer.set_exception(exception)
    else:
        assert job is not None
        answer.set_result(job)


def _retrieved(answer: asyncio.Future[jobs_pb2.Job]) -> None:
    """Marks an answer's exception as seen: its caller may have been cancelled
    and never look (the attempt it belonged to is over either way)."""
    if not answer.cancelled():
        answer.exception()

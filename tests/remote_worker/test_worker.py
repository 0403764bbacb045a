"""The Worker's claim loop and lifecycle against a fake WorkerService: the same
handler API as in-process, a stop that abandons the long poll and hands back what
is unfinished, and a server that restarts or refuses."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from structlog.testing import capture_logs

from leasehold._server.defaults import DEFAULT_CONCURRENCY
from leasehold._server.jobs import state_machine
from leasehold.worker import HandlerRegistry, JobContext, PermanentError, Worker, WorkerRefused
from tests.remote_worker.fake_server import TOKEN, FakeWorkerService, fake_server, running_worker


def _registry(**handlers: object) -> HandlerRegistry:
    registry = HandlerRegistry()
    for kind, handler in handlers.items():
        registry.register(kind.replace("_", "."), handler)  # type: ignore[arg-type]
    return registry


async def test_a_handler_sees_the_payload_and_its_result_is_completed() -> None:
    async def double(ctx: JobContext) -> dict[str, object]:
        await ctx.append_event("progress", {"half": True})
        return {"doubled": [n * 2 for n in range(ctx.payload["n"])]}  # an int, as in-process

    async with fake_server() as (service, address):
        async with running_worker(address, _registry(test_double=double)):
            await service.enqueue("test.double", {"n": 3})
            await service.until(lambda: bool(service.named("Complete")))
    assert [call.method for call in service.writes()] == ["AppendEvent", "Complete"]
    result = service.named("Complete")[0].request.result
    assert list(result["doubled"]) == [0, 2, 4]
    claim = service.named("Claim")[0].request
    assert (list(claim.kinds), claim.max_jobs) == (["test.double"], DEFAULT_CONCURRENCY)


async def test_failures_keep_their_type_and_permanent_errors_are_not_retried() -> None:
    async def broken(ctx: JobContext) -> None:
        raise KeyError("missing")

    async def hopeless(ctx: JobContext) -> None:
        raise PermanentError("never")

    async with fake_server() as (service, address):
        async with running_worker(address, _registry(test_broken=broken, test_hopeless=hopeless)):
            await service.enqueue("test.broken")
            await service.enqueue("test.hopeless")
            await service.until(lambda: len(service.named("Fail")) == 2)
    sent = {call.request.error_type: call.request.non_retryable for call in service.named("Fail")}
    assert sent == {"KeyError": False, "PermanentError": True}


async def test_a_handler_past_its_timeout_fails_as_in_process() -> None:
    async def slow(ctx: JobContext) -> None:
        await asyncio.Event().wait()

    async with fake_server() as (service, address):
        async with running_worker(address, _registry(test_slow=slow)):
            await service.enqueue("test.slow", timeout_seconds=1)
            await service.until(lambda: bool(service.named("Fail")))
    fail = service.named("Fail")[0].request
    assert (fail.error_message, fail.error_type) == (
        state_machine.TIMEOUT_ERROR_TEXT,
        state_machine.TIMEOUT_ERROR_TYPE,
    )


async def test_stop_lets_handlers_finish_within_the_grace_and_snoozes_the_rest() -> None:
    quick_may_finish = asyncio.Event()

    async def quick(ctx: JobContext) -> None:
        await quick_may_finish.wait()

    async def endless(ctx: JobContext) -> None:
        await asyncio.Event().wait()

    async with fake_server() as (service, address):
        worker = Worker(
            address, _registry(test_quick=quick, test_endless=endless), TOKEN, stop_grace_seconds=0.3
        )
        run = asyncio.create_task(worker.run())
        quick_id = await service.enqueue("test.quick")
        endless_id = await service.enqueue("test.endless")
        await service.until(lambda: worker.active_jobs == 2 or len(service.named("Claim")) >= 2)
        stopping = asyncio.create_task(worker.stop())
        quick_may_finish.set()
        await stopping
        await run
    assert [call.request.job_id for call in service.named("Complete")] == [quick_id]
    assert [(call.request.job_id, call.request.delay_seconds) for call in service.named("Snooze")] == [
        (endless_id, 1)
    ]


async def test_stop_abandons_the_long_poll_at_once() -> None:
    async with fake_server() as (service, address):
        worker = Worker(address, _registry(test_idle=lambda ctx: None), TOKEN, claim_wait_seconds=60)
        run = asyncio.create_task(worker.run())
        await service.until(lambda: bool(service.named("Claim")))
        # Half the poll's 60 s: a stop that waited the poll out would time out here.
        async with asyncio.timeout(30):
            await worker.stop()
            await run
        await service.until(lambda: service.abandoned_claims == 1)


async def test_a_server_that_is_unavailable_is_retried_with_backoff() -> None:
    async def noop(ctx: JobContext) -> None:
        return None

    service = FakeWorkerService()
    service.fail_next("GetServerInfo", grpc.StatusCode.UNAVAILABLE, times=2)
    service.fail_next("Claim", grpc.StatusCode.UNAVAILABLE, times=3)
    async with fake_server(service) as (_, address):
        with capture_logs() as logs:
            async with running_worker(address, _registry(test_noop=noop)):
                await service.enqueue("test.noop")
                await service.until(lambda: bool(service.named("Complete")), timeout=15)
    assert len(service.named("GetServerInfo")) == 3
    assert [entry["code"] for entry in logs if entry["event"] == "worker.claim_failed"] == ["UNAVAILABLE"] * 3


async def test_a_worker_comes_back_when_its_server_restarts() -> None:
    async def noop(ctx: JobContext) -> None:
        return None

    async with fake_server() as (first, address):
        pass  # the port is free again: nothing serves it for a moment
    async with running_worker(address, _registry(test_noop=noop)):
        second = FakeWorkerService()
        server = grpc.aio.server()
        from leasehold.v1 import worker_pb2_grpc

        worker_pb2_grpc.add_WorkerServiceServicer_to_server(second, server)
        server.add_insecure_port(address)
        await server.start()
        try:
            await second.enqueue("test.noop")
            await second.until(lambda: bool(second.named("Complete")), timeout=15)
        finally:
            await server.stop(0)


@pytest.mark.parametrize(
    ("service", "token", "message"),
    [
        (FakeWorkerService(protocol_version=3), TOKEN, "protocol 3"),
        (FakeWorkerService(), "a-wrong-token-of-enough-length", "LEASEHOLD_WORKER_TOKEN"),
    ],
)
async def test_a_server_it_cannot_work_for_is_refused_clearly(
    service: FakeWorkerService, token: str, message: str
) -> None:
    async with fake_server(service) as (_, address):
        worker = Worker(address, _registry(test_noop=lambda ctx: None), token)
        with pytest.raises(WorkerRefused, match=message):
            await worker.run()
    assert service.named("Claim") == []


async def test_a_claim_refused_for_its_kinds_stops_the_worker_after_draining() -> None:
    release = asyncio.Event()

    async def waits(ctx: JobContext) -> None:
        await release.wait()

    async with fake_server() as (service, address):
        worker = Worker(address, _registry(test_waits=waits), TOKEN, stop_grace_seconds=0)
        run = asyncio.create_task(worker.run())
        job_id = await service.enqueue("test.waits")
        await service.until(lambda: len(service.named("Claim")) >= 2)  # the job is running
        service.fail_next("Claim", grpc.StatusCode.INVALID_ARGUMENT)
        # Taken by the poll in flight; the next poll is refused.
        second_id = await service.enqueue("test.waits")
        with pytest.raises(WorkerRefused, match="kinds"):
            await run
    # The running jobs were handed back before run() gave up.
    assert {call.request.job_id for call in service.named("Snooze")} == {job_id, second_id}


@pytest.mark.parametrize(
    ("options", "setting"),
    [
        ({"token": "short"}, "LEASEHOLD_WORKER_TOKEN"),
        ({"concurrency": 0}, "concurrency"),
        ({"kinds": ["test.other"]}, "kinds"),
        ({"worker_id": "x" * 129}, "worker_id"),
    ],
)
def test_bad_arguments_fail_at_construction_naming_the_setting(
    options: dict[str, object], setting: str
) -> None:
    arguments: dict[str, object] = {"token": TOKEN, **options}
    token = str(arguments.pop("token"))
    with pytest.raises(ValueError, match=setting):
        Worker("127.0.0.1:1", _registry(test_noop=lambda ctx: None), token, **arguments)  # type: ignore[arg-type]


async def test_a_protocol_2_server_is_worked_for() -> None:
    """Protocol 2 only adds to protocol 1: a worker that refused it would stop
    working the day its server is upgraded."""
    async with fake_server(FakeWorkerService(protocol_version=2)) as (service, address):
        async with running_worker(address, _registry(test_noop=lambda ctx: None)):
            await service.enqueue("test.noop")
            await service.until(lambda: bool(service.named("Complete")))

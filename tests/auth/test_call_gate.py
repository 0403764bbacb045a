"""The call gate every RPC passes (method_handlers.py + call_gate.py), on a real
server and port: unary calls in flight per owner are limited (streams are not
counted), and what is logged while a call is served names its method, owner and
job. The servicer here holds its calls open until told, so "in flight" is
exact, not timed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import structlog
from google.rpc import error_details_pb2

from leasehold._server.api import method_handlers
from leasehold._server.api.call_gate import CallGate, OwnerCallLimit
from leasehold._server.api.servicer import SERVICE
from leasehold._server.auth.header import HeaderAuthenticator
from leasehold._server.auth.identity import Role
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import error_reason, expect_error, rich_status
from tests.support import OTHER_OWNER, OWNER, owner_metadata

log = structlog.get_logger("tests.auth")
JOB_ID = "job_" + "a" * 32


class HeldServicer:
    """Get waits for `release`; WatchEvents yields one event, then waits too;
    every other JobService RPC is never called here."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Semaphore(0)

    async def get(self, data: bytes, context: Any) -> jobs_pb2.GetResponse:
        log.info("test.get_entered")
        self.entered.release()
        await self.release.wait()
        return jobs_pb2.GetResponse()

    async def watch_events(self, data: bytes, context: Any) -> AsyncIterator[jobs_pb2.WatchEventsResponse]:
        self.entered.release()
        yield jobs_pb2.WatchEventsResponse()
        await self.release.wait()

    def __getattr__(self, name: str) -> Any:
        async def unused(data: bytes, context: Any) -> None:
            raise AssertionError(name)

        return unused


@pytest.fixture
async def held() -> AsyncIterator[tuple[HeldServicer, jobs_pb2_grpc.JobServiceStub]]:
    servicer = HeldServicer()
    gate = CallGate(HeaderAuthenticator(None), Role.OWNER, OwnerCallLimit(2))
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((method_handlers.generic_handler(SERVICE, servicer, gate),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield servicer, jobs_pb2_grpc.JobServiceStub(channel)
    finally:
        servicer.release.set()
        await server.stop(0)


def _get(stub: jobs_pb2_grpc.JobServiceStub, owner: str) -> Any:
    return stub.Get(jobs_pb2.GetRequest(job_id=JOB_ID), metadata=owner_metadata(owner))


async def _entered(servicer: HeldServicer, count: int) -> None:
    async with asyncio.timeout(10):
        for _ in range(count):
            await servicer.entered.acquire()


async def test_an_owner_over_the_limit_gets_resource_exhausted_naming_it(held) -> None:
    servicer, stub = held
    first, second = _get(stub, OWNER), _get(stub, OWNER)
    await _entered(servicer, 2)

    err = await expect_error(_get(stub, OWNER), grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert (
        err.details()
        == "too many calls in flight for this owner: the limit max-calls-per-owner (2) is reached"
    )
    assert error_reason(err) == "MAX_CALLS_PER_OWNER_EXCEEDED"
    info = error_details_pb2.ErrorInfo()
    assert rich_status(err).details[0].Unpack(info)
    assert dict(info.metadata) == {"limit": "max-calls-per-owner", "value": "2"}

    # Another owner is not held back by this one; streams are not counted.
    other = _get(stub, OTHER_OWNER)
    watch = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=JOB_ID), metadata=owner_metadata(OWNER))
    await _entered(servicer, 2)
    assert await watch.read() == jobs_pb2.WatchEventsResponse()

    servicer.release.set()
    await asyncio.gather(first, second, other)
    watch.cancel()
    # Every slot was given back: the owner may have two in flight again.
    servicer.release.clear()
    again = [_get(stub, OWNER), _get(stub, OWNER)]
    await _entered(servicer, 2)
    servicer.release.set()
    await asyncio.gather(*again)


async def test_a_refused_credential_takes_no_slot(held) -> None:
    servicer, stub = held
    for _ in range(3):
        await expect_error(stub.Get(jobs_pb2.GetRequest(job_id=JOB_ID)), grpc.StatusCode.UNAUTHENTICATED)
    calls = [_get(stub, OWNER), _get(stub, OWNER)]
    await _entered(servicer, 2)
    servicer.release.set()
    await asyncio.gather(*calls)


async def test_records_logged_while_serving_name_the_method_and_owner(held) -> None:
    servicer, stub = held
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as records:
        call = _get(stub, OWNER)
        await _entered(servicer, 1)
        servicer.release.set()
        await call
    entered = [record for record in records if record["event"] == "test.get_entered"]
    assert entered == [
        {"event": "test.get_entered", "log_level": "info", "method": "JobService.Get", "owner_id": OWNER}
    ]

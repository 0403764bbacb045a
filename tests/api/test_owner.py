"""Owner identity from the `x-owner-id` header (DESIGN §2 Owner identity).

Missing, empty, repeated or malformed → UNAUTHENTICATED, before anything else is
looked at, deterministically. Health and reflection need no owner.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from grpc import StatusCode
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    collect_events,
    drain,
    enqueue,
    error_reason,
    expect_error,
    get_job,
    list_all,
    wait_for_terminal,
)
from tests.support import OWNER

HEADER = "x-owner-id"
SOME_ID = "job_" + "0" * 32

BAD_OWNER_METADATA = {
    "missing": (),
    "other header only": (("x-owner", OWNER), ("owner-id", OWNER)),
    "empty": ((HEADER, ""),),
    "sent twice, same value": ((HEADER, OWNER), (HEADER, OWNER)),
    "sent twice, different values": ((HEADER, OWNER), (HEADER, "bob")),
    "space": ((HEADER, "al ice"),),
    "leading space": ((HEADER, " " + OWNER),),
    "trailing space": ((HEADER, OWNER + " "),),
    "slash": ((HEADER, "alice/bob"),),
    "comma": ((HEADER, "alice,bob"),),
    "asterisk": ((HEADER, "alice*"),),
    "129 characters": ((HEADER, "a" * 129),),
    "8 KB": ((HEADER, "a" * 8192),),
}


def _every_rpc(stub, metadata):
    """One call of each JobService RPC, each otherwise well-formed."""
    return {
        "Enqueue": lambda: stub.Enqueue(jobs_pb2.EnqueueRequest(kind="example.echo"), metadata=metadata),
        "Get": lambda: stub.Get(jobs_pb2.GetRequest(job_id=SOME_ID), metadata=metadata),
        "List": lambda: stub.List(jobs_pb2.ListRequest(), metadata=metadata),
        "Cancel": lambda: stub.Cancel(jobs_pb2.CancelRequest(job_id=SOME_ID), metadata=metadata),
        "Retry": lambda: stub.Retry(jobs_pb2.RetryRequest(job_id=SOME_ID), metadata=metadata),
        "WatchEvents": lambda: drain(
            stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=SOME_ID), metadata=metadata)
        ),
        "BatchEnqueue": lambda: stub.BatchEnqueue(
            jobs_pb2.BatchEnqueueRequest(requests=[jobs_pb2.EnqueueRequest(kind="example.echo")]),
            metadata=metadata,
        ),
        "Subscribe": lambda: drain(stub.Subscribe(jobs_pb2.SubscribeRequest(), metadata=metadata)),
    }


@pytest.mark.parametrize("metadata", BAD_OWNER_METADATA.values(), ids=BAD_OWNER_METADATA.keys())
async def test_every_rpc_without_a_usable_owner_is_unauthenticated(stub, app, metadata):
    for rpc, call in _every_rpc(stub, metadata).items():
        err = await expect_error(call(), StatusCode.UNAUTHENTICATED)
        assert error_reason(err) == "OWNER_UNRESOLVED", rpc
    # The rejected Enqueue wrote nothing, not even for the owner the header named.
    assert await list_all(stub, owner=OWNER) == []


async def test_eight_kilobyte_owner_is_rejected_the_same_way_every_time(stub, app):
    metadata = ((HEADER, "x" * 8192),)
    outcomes = set()
    for _ in range(20):
        err = await expect_error(
            stub.Get(jobs_pb2.GetRequest(job_id=SOME_ID), metadata=metadata), StatusCode.UNAUTHENTICATED
        )
        outcomes.add((err.code(), err.details(), tuple(err.trailing_metadata() or ())))
    assert len(outcomes) == 1


async def test_owner_is_resolved_before_the_request_is_validated(stub, channel, app):
    no_owner = ()
    await expect_error(
        stub.Enqueue(jobs_pb2.EnqueueRequest(kind=""), metadata=no_owner), StatusCode.UNAUTHENTICATED
    )
    await expect_error(
        stub.Get(jobs_pb2.GetRequest(job_id=""), metadata=no_owner), StatusCode.UNAUTHENTICATED
    )
    await expect_error(
        stub.List(jobs_pb2.ListRequest(page_size=-1), metadata=no_owner), StatusCode.UNAUTHENTICATED
    )
    undecodable = channel.unary_unary(
        "/leasehold.v1.JobService/Enqueue",
        request_serializer=lambda data: data,
        response_deserializer=jobs_pb2.EnqueueResponse.FromString,
    )
    await expect_error(undecodable(b"\x0a\x64abc", metadata=no_owner), StatusCode.UNAUTHENTICATED)


async def test_longest_legal_owner_using_every_allowed_character_works(stub, app):
    alphabet = "AZaz09._:@-"
    owner = (alphabet * 12)[:128]
    assert len(owner) == 128

    job = (await enqueue(stub, owner=owner)).job
    finished = await wait_for_terminal(stub, job.id, owner=owner)

    assert finished.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert [listed.id for listed in await list_all(stub, owner=owner)] == [job.id]
    assert (await get_job(stub, job.id, owner=owner)).id == job.id
    assert [e.type for e in await collect_events(stub, job.id, owner=owner)][-1] == "job.succeeded"


async def test_single_character_owner_works(stub, app):
    job = (await enqueue(stub, owner="z")).job
    assert (await get_job(stub, job.id, owner="z")).id == job.id


async def test_owner_ids_are_case_sensitive(stub, app):
    job = (await enqueue(stub, owner="alice")).job
    await expect_error(
        stub.Get(jobs_pb2.GetRequest(job_id=job.id), metadata=((HEADER, "Alice"),)),
        StatusCode.PERMISSION_DENIED,
    )
    assert await list_all(stub, owner="Alice") == []


@pytest.mark.parametrize("service", ["", "leasehold.v1.JobService"])
async def test_health_check_needs_no_owner(channel, app, service):
    health = health_pb2_grpc.HealthStub(channel)
    response = await health.Check(health_pb2.HealthCheckRequest(service=service))
    assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_health_check_of_an_unknown_service_is_not_found(channel, app):
    health = health_pb2_grpc.HealthStub(channel)
    await expect_error(
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service")), StatusCode.NOT_FOUND
    )


async def _reflect(channel, *requests: reflection_pb2.ServerReflectionRequest):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(iter(requests))
    return [response async for response in call]


async def test_reflection_lists_services_without_an_owner(channel, app):
    (response,) = await _reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))

    names = {service.name for service in response.list_services_response.service}
    assert {"leasehold.v1.JobService", "grpc.health.v1.Health"} <= names


async def test_reflection_describes_the_job_service(channel, app):
    (response,) = await _reflect(
        channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol="leasehold.v1.JobService")
    )

    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    services = {
        f"{file.package}.{service.name}": [method.name for method in service.method]
        for file in files
        for service in file.service
    }
    assert services["leasehold.v1.JobService"] == [
        "Enqueue",
        "Get",
        "List",
        "Cancel",
        "Retry",
        "WatchEvents",
        "BatchEnqueue",
        "GetStats",
        "Subscribe",
    ]

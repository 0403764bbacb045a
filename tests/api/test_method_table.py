"""Every RPC the JobService descriptor declares is served by the running server
(the method table is built from the descriptor: tests/unit/test_method_handlers.py)."""

from __future__ import annotations

import grpc
import pytest

from leasehold.v1 import jobs_pb2
from tests.api.helpers import drain, expect_error

SERVICE = jobs_pb2.DESCRIPTOR.services_by_name["JobService"]


@pytest.mark.parametrize("method", list(SERVICE.methods), ids=lambda method: method.name)
async def test_every_rpc_of_the_descriptor_is_served(channel: grpc.aio.Channel, method) -> None:
    # An empty request without an owner: an RPC that is served resolves the owner
    # first and refuses; one that is not would answer UNIMPLEMENTED.
    path = f"/{SERVICE.full_name}/{method.name}"
    if method.server_streaming:
        call = drain(channel.unary_stream(path)(b""))
    else:
        call = channel.unary_unary(path)(b"")

    err = await expect_error(call, grpc.StatusCode.UNAUTHENTICATED)

    assert "x-owner-id" in (err.details() or "")

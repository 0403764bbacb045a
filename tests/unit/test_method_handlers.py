"""The servicer's method table comes from the service descriptor: every RPC is
bound to its snake_case method, and one missing fails at start-up, naming it."""

from __future__ import annotations

import pytest

from leasehold._server.api.call_gate import CallGate, OwnerCallLimit
from leasehold._server.api.method_handlers import method_handlers, python_name
from leasehold._server.api.page_token import PageTokenCodec
from leasehold._server.api.servicer import SERVICE, JobServiceServicer
from leasehold._server.auth.header import HeaderAuthenticator
from leasehold._server.auth.identity import Role
from leasehold.v1 import jobs_pb2

GATE = CallGate(HeaderAuthenticator(None), Role.OWNER, OwnerCallLimit())


def _servicer(cls: type[JobServiceServicer] = JobServiceServicer) -> JobServiceServicer:
    # Building the table touches no collaborator: none is needed here.
    return cls(None, frozenset, PageTokenCodec(b"k" * 32))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rpc", "method"),
    [
        ("Enqueue", "enqueue"),
        ("WatchEvents", "watch_events"),
        ("GetHTTPStatus", "get_http_status"),
        ("ClaimV2", "claim_v2"),
    ],
)
def test_an_rpc_is_implemented_by_its_snake_case_method(rpc: str, method: str) -> None:
    assert python_name(rpc) == method


def test_every_rpc_of_the_descriptor_gets_a_handler_of_its_shape() -> None:
    handlers = method_handlers(SERVICE, _servicer(), GATE)

    assert set(handlers) == {m.name for m in jobs_pb2.DESCRIPTOR.services_by_name["JobService"].methods}
    shapes = {name: (h.request_streaming, h.response_streaming) for name, h in handlers.items()}
    streams = {"WatchEvents", "Subscribe"}
    assert {shapes[name] for name in streams} == {(False, True)}
    assert {shape for name, shape in shapes.items() if name not in streams} == {(False, False)}
    assert all(h.unary_unary or h.unary_stream for h in handlers.values())


def test_a_servicer_missing_an_rpc_fails_with_one_line_naming_it() -> None:
    class WithoutRetry(JobServiceServicer):
        retry = None  # type: ignore[assignment]

    with pytest.raises(ValueError) as caught:
        _servicer(WithoutRetry).generic_handler(GATE)

    assert str(caught.value) == "JobService.Retry has no implementation (expected WithoutRetry.retry)"


def test_an_object_without_the_methods_fails_on_the_first_rpc() -> None:
    with pytest.raises(
        ValueError, match=r"^JobService\.Enqueue has no implementation \(expected object\.enqueue\)$"
    ):
        method_handlers(SERVICE, object(), GATE)

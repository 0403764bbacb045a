"""A gRPC service's method table, built from its protobuf service descriptor.

The descriptor is the contract: every RPC it declares gets a handler, chosen
unary or server-streaming from the descriptor itself, bound to the servicer
method of the same name in snake_case (`WatchEvents` -> `watch_events`). An
RPC the servicer does not implement fails start-up with one line naming it,
instead of answering UNIMPLEMENTED to the first caller who tries it. Shared by
every Leasehold service (JobService now, WorkerService and the others later).

Handlers receive the request as raw bytes and decode it themselves (see
servicer.py: an undecodable request becomes INVALID_ARGUMENT, not grpc's
UNKNOWN); every exception they raise is answered through `status_for`. Before
a handler runs, the service's `CallGate` checks the caller's credential and role
(call_gate.py): the one place roles are enforced.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from leasehold._server.api.call_gate import CallGate, call_log_context
from leasehold._server.api.errors import status_for
from leasehold._server.api.rpc_outcomes import RpcObserver, counted_stream, counted_unary, unobserved
from leasehold._server.jobs.errors import InvalidArgument

UnaryMethod = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]
StreamMethod = Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[Message]]

# A lower/digit-to-upper boundary (`WatchEvents`), or the end of an acronym
# before a capitalised word (`GetHTTPStatus` -> get_http_status).
_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


M = TypeVar("M", bound=Message)


def decode(message_type: type[M], data: bytes) -> M:
    """The request a handler received as bytes; INVALID_ARGUMENT (not grpc's
    UNKNOWN) when protobuf cannot parse it."""
    message = message_type()
    try:
        message.ParseFromString(data)
    except (DecodeError, RecursionError) as exc:
        raise InvalidArgument("request", f"cannot be decoded: {exc}") from None
    return message


def python_name(rpc_name: str) -> str:
    """The servicer method that implements `rpc_name`: its snake_case form."""
    return _WORD_BOUNDARY.sub("_", rpc_name).lower()


def method_handlers(
    service: ServiceDescriptor, servicer: object, gate: CallGate, rpc_finished: RpcObserver = unobserved
) -> dict[str, grpc.RpcMethodHandler]:
    """One handler per RPC of `service`, keyed by RPC name, each behind `gate`.
    Raises ValueError naming the first RPC `servicer` lacks, or one whose shape
    (client or bidirectional streaming) has no wiring here yet."""
    return {
        method.name: _handler(service, method, _implementation(service, method, servicer), gate, rpc_finished)
        for method in service.methods
    }


def generic_handler(
    service: ServiceDescriptor, servicer: object, gate: CallGate, rpc_finished: RpcObserver = unobserved
) -> grpc.GenericRpcHandler:
    """The handler to pass to `server.add_generic_rpc_handlers`; `gate` admits
    callers, `rpc_finished` is told every RPC's final status code (the metrics)."""
    return grpc.method_handlers_generic_handler(
        service.full_name, method_handlers(service, servicer, gate, rpc_finished)
    )


def _implementation(service: ServiceDescriptor, method: MethodDescriptor, servicer: object) -> Any:
    expected = python_name(method.name)
    implementation = getattr(servicer, expected, None)
    if not callable(implementation):
        raise ValueError(
            f"{service.name}.{method.name} has no implementation "
            f"(expected {type(servicer).__name__}.{expected})"
        )
    return implementation


def _handler(
    service: ServiceDescriptor,
    method: MethodDescriptor,
    implementation: Any,
    gate: CallGate,
    rpc_finished: RpcObserver,
) -> grpc.RpcMethodHandler:
    rpc = f"{service.full_name}/{method.name}"
    if method.client_streaming:
        raise ValueError(
            f"{service.name}.{method.name} is client-streaming, which method_handlers does not serve yet"
        )
    name = f"{service.name}.{method.name}"  # the `method` of every log record the call makes
    if method.server_streaming:
        return grpc.unary_stream_rpc_method_handler(
            counted_stream(_stream_errors(implementation, name, gate), rpc, rpc_finished),
            response_serializer=_serialize,
        )
    return grpc.unary_unary_rpc_method_handler(
        counted_unary(_unary_errors(implementation, name, gate), rpc, rpc_finished),
        response_serializer=_serialize,
    )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _unary_errors(method: UnaryMethod, name: str, gate: CallGate) -> UnaryMethod:
    @functools.wraps(method)
    async def wrapper(data: bytes, context: grpc.aio.ServicerContext) -> Message:
        with call_log_context(name):
            try:
                with gate.admitted(context, unary=True):
                    return await method(data, context)
            except Exception as exc:
                await context.abort_with_status(status_for(exc))
                raise  # abort_with_status always raises; this keeps type checkers honest

    return wrapper


def _stream_errors(method: StreamMethod, name: str, gate: CallGate) -> StreamMethod:
    @functools.wraps(method)
    async def wrapper(data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        with call_log_context(name):
            try:
                with (
                    gate.admitted(context, unary=False) as identity,
                    gate.streams.guarded(
                        identity, gate.role, lambda: gate.recheck(context, identity)
                    ) as guard,
                ):
                    try:
                        async for message in method(data, context):
                            yield message
                    except asyncio.CancelledError:
                        if guard.refusal is None:
                            raise  # the caller went away, or the server stops
                        # Ended because its credential did: answered as a refusal.
                        task = asyncio.current_task()
                        if task is not None:
                            task.uncancel()
                        raise guard.refusal from None
            except Exception as exc:
                await context.abort_with_status(status_for(exc))

    return wrapper

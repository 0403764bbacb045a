"""Each RPC's final status code, told to an observer (the metrics).

Wrapped around method_handlers' error wrappers, so whatever they answer (OK, the
status `status_for` chose, or nothing because the caller went away) is what is
counted, and they stay as they are.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf.message import Message

# Told each RPC's full name ("leasehold.v1.JobService/Enqueue") and final code.
RpcObserver = Callable[[str, grpc.StatusCode], None]
UnaryMethod = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]
StreamMethod = Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[Message]]


def final_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The code the call was aborted with; CANCELLED when it was not aborted but
    still did not finish (the caller went away, or the server stopped first)."""
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.CANCELLED


def counted_unary(method: UnaryMethod, rpc: str, rpc_finished: RpcObserver) -> UnaryMethod:
    @functools.wraps(method)
    async def wrapper(data: bytes, context: grpc.aio.ServicerContext) -> Message:
        try:
            response = await method(data, context)
        except BaseException:
            rpc_finished(rpc, final_code(context))
            raise
        rpc_finished(rpc, grpc.StatusCode.OK)
        return response

    return wrapper


def counted_stream(method: StreamMethod, rpc: str, rpc_finished: RpcObserver) -> StreamMethod:
    @functools.wraps(method)
    async def wrapper(data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        try:
            async for message in method(data, context):
                yield message
        except BaseException:  # also the caller closing the stream (GeneratorExit)
            rpc_finished(rpc, final_code(context))
            raise
        rpc_finished(rpc, grpc.StatusCode.OK)

    return wrapper


def unobserved(_rpc: str, _code: grpc.StatusCode) -> None:
    pass

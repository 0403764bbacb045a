"""What every call of a client shares: the channel, the credentials and the retry
rules, and the one place a unary call is made and retried."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from leasehold.client._retry import READ_RETRYABLE, WRITE_RETRYABLE, RetryOptions, call_with_retries

Response = TypeVar("Response")


@dataclass(frozen=True)
class Session:
    target: str  # as the caller gave it: what messages about the connection name
    channel: grpc.aio.Channel
    metadata: tuple[tuple[str, str], ...]
    retry: RetryOptions

    async def read(self, method: Callable[..., Awaitable[Response]], request: Any) -> Response:
        """A call that changes nothing: repeated after UNAVAILABLE or DEADLINE_EXCEEDED."""
        return await self._call(method, request, READ_RETRYABLE)

    async def write(self, method: Callable[..., Awaitable[Response]], request: Any) -> Response:
        """A call that is safe to repeat (idempotent, or carrying a request_id):
        repeated after UNAVAILABLE only."""
        return await self._call(method, request, WRITE_RETRYABLE)

    async def long_write(self, method: Callable[..., Awaitable[Response]], request: Any) -> Response:
        """A write whose one try may take as long as the work it was given (a
        bulk action walks every matching job): repeated after UNAVAILABLE, with
        no per-try timeout, since cutting it short would cancel it part way."""
        return await self._call(method, request, WRITE_RETRYABLE, bounded=False)

    async def _call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        codes: frozenset[grpc.StatusCode],
        *,
        bounded: bool = True,
    ) -> Response:
        async def attempt(timeout: float) -> Response:
            return await method(request, metadata=self.metadata, timeout=timeout if bounded else None)

        return await call_with_retries(attempt, self.retry, codes)

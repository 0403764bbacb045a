"""gRPC statuses from WorkerService as domain exceptions, in one place.

The executor already knows what to do with `LeaseLost` (stop, write nothing),
`StorageUnavailable` and `StorageFull` (retry while the lease holds) and
`InvalidArgument` (a mistake worth showing). Mapping the server's statuses onto
them is what lets the executor run a remote attempt unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2

from leasehold._server.jobs.errors import (
    EventLimitReached,
    InvalidArgument,
    LeaseholdError,
    LeaseLost,
    StorageFull,
    StorageUnavailable,
)

T = TypeVar("T")

# Codes that say "try again": the server is restarting, slow, or busy.
TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_STATUS_DETAILS_KEY = "grpc-status-details-bin"
# The ErrorInfo reason of `max-events-per-job` (server/api/errors.py).
EVENT_LIMIT_REASON = "MAX_EVENTS_PER_JOB_EXCEEDED"


class WorkerServiceError(LeaseholdError):
    """A status the worker cannot act on (UNAUTHENTICATED, INTERNAL, ...). It
    carries the code only: the server's words stay out of the worker's logs."""

    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(f"worker service answered {code.name}")
        self.code = code


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """What every WorkerService call sends (DESIGN §10 Who may call); nothing
    when a client certificate identifies the worker (serve --auth mtls)."""
    return (("authorization", f"Bearer {token}"),) if token is not None else ()


async def mapped(call: Awaitable[T], job_id: str) -> T:
    """Await one call for the attempt on `job_id`, raising its status as the
    domain exception the executor handles."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise domain_error(exc, job_id) from None


def domain_error(error: grpc.aio.AioRpcError, job_id: str) -> LeaseholdError:
    code = error.code()
    if code is grpc.StatusCode.ABORTED:
        return LeaseLost(job_id)  # fenced out: the server says nothing more, by design
    if code in TRANSIENT_CODES:
        return StorageUnavailable(f"worker service answered {code.name}")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        limit = _error_info(error)
        if limit is not None and limit.reason == EVENT_LIMIT_REASON:
            # The handler sees what it sees in process: the job's log is full.
            return EventLimitReached(job_id, int(limit.metadata.get("value") or 0))
        return StorageFull(f"worker service answered {code.name}")
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        field, description = bad_request(error)
        return InvalidArgument(field, description)
    return WorkerServiceError(code)


def _status_details(error: grpc.aio.AioRpcError) -> status_pb2.Status:
    status = status_pb2.Status()
    for key, value in error.trailing_metadata() or ():
        if key == _STATUS_DETAILS_KEY and isinstance(value, bytes):
            status.ParseFromString(value)
    return status


def _error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    for detail in _status_details(error).details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None


def bad_request(error: grpc.aio.AioRpcError) -> tuple[str, str]:
    """The first field violation of the status's BadRequest detail (AIP-193),
    else no field and the status message."""
    status = _status_details(error)
    for detail in status.details:
        violations = error_details_pb2.BadRequest()
        if detail.Unpack(violations) and violations.field_violations:
            first = violations.field_violations[0]
            return first.field, first.description
    return "", error.details() or "invalid argument"

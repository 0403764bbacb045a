"""The one place where errors become gRPC statuses (AIP-193).

Every status carries an ErrorInfo (reason, domain "leasehold"); invalid input also
carries a BadRequest naming the field. The trailers hold only what the message
holds (no request ids, times or host names), so denying access to a job that
exists and to one that does not produce byte-identical responses.
"""

from __future__ import annotations

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from leasehold._server.auth.identity import KindsNotPermitted, RoleNotPermitted, Unauthenticated
from leasehold._server.jobs.errors import (
    CommitOutcomeUnknown,
    FeedPositionExpired,
    InvalidArgument,
    JobNotFound,
    KindNotServed,
    LeaseLost,
    LimitExceeded,
    RequestIdReused,
    RequestResultDeleted,
    RetryNotAllowed,
    ScheduleExists,
    ScheduleNotFound,
    ServerDraining,
    StorageFull,
    StorageUnavailable,
)

log = structlog.get_logger("leasehold.api")

DOMAIN = "leasehold"


def status_for(exc: BaseException) -> grpc.Status:
    if isinstance(exc, Unauthenticated):  # OWNER_UNRESOLVED, WORKER_UNAUTHENTICATED, ...
        return _status(code_pb2.UNAUTHENTICATED, str(exc), exc.reason)
    if isinstance(exc, RoleNotPermitted):
        return _status(code_pb2.PERMISSION_DENIED, str(exc), exc.reason)
    if isinstance(exc, KindsNotPermitted):
        violation = error_details_pb2.BadRequest.FieldViolation(field=exc.field, description=str(exc))
        return _status(
            code_pb2.PERMISSION_DENIED,
            str(exc),
            "KINDS_NOT_PERMITTED",
            error_details_pb2.BadRequest(field_violations=[violation]),
        )
    if isinstance(exc, InvalidArgument):
        violation = error_details_pb2.BadRequest.FieldViolation(field=exc.field, description=exc.description)
        return _status(
            code_pb2.INVALID_ARGUMENT,
            str(exc),
            "INVALID_ARGUMENT",
            error_details_pb2.BadRequest(field_violations=[violation]),
        )
    if isinstance(exc, JobNotFound):
        return _status(code_pb2.PERMISSION_DENIED, str(exc), "JOB_NOT_ACCESSIBLE")
    if isinstance(exc, ScheduleNotFound):
        return _status(code_pb2.PERMISSION_DENIED, str(exc), "SCHEDULE_NOT_ACCESSIBLE")
    if isinstance(exc, ScheduleExists):
        violation = error_details_pb2.BadRequest.FieldViolation(
            field="schedule_id", description="the caller already has a schedule with this id"
        )
        return _status(
            code_pb2.ALREADY_EXISTS,
            str(exc),
            "SCHEDULE_EXISTS",
            error_details_pb2.BadRequest(field_violations=[violation]),
        )
    if isinstance(exc, RequestIdReused | RequestResultDeleted):
        reason = "REQUEST_ID_REUSED" if isinstance(exc, RequestIdReused) else "REQUEST_ID_RESULT_DELETED"
        violation = error_details_pb2.PreconditionFailure.Violation(
            type=reason, subject="request_id", description=str(exc)
        )
        return _status(
            code_pb2.FAILED_PRECONDITION,
            str(exc),
            reason,
            error_details_pb2.PreconditionFailure(violations=[violation]),
        )
    if isinstance(exc, RetryNotAllowed):
        return _status(code_pb2.FAILED_PRECONDITION, str(exc), "JOB_NOT_RETRYABLE")
    if isinstance(exc, KindNotServed):
        return _status(code_pb2.FAILED_PRECONDITION, str(exc), "KIND_NOT_SERVED")
    if isinstance(exc, LeaseLost):
        return _status(code_pb2.ABORTED, str(exc), "LEASE_LOST")
    if isinstance(exc, LimitExceeded):
        # The reason and the metadata name the limit's flag, so a client can tell
        # which limit it met without parsing the message.
        reason = exc.limit.replace("-", "_").upper() + "_EXCEEDED"
        named: tuple[error_details_pb2.BadRequest, ...] = ()
        if exc.field is not None:  # the item of a batch that met it, too
            violation = error_details_pb2.BadRequest.FieldViolation(field=exc.field, description=str(exc))
            named = (error_details_pb2.BadRequest(field_violations=[violation]),)
        return _status(
            code_pb2.RESOURCE_EXHAUSTED, str(exc), reason, *named, limit=exc.limit, value=str(exc.value)
        )
    if isinstance(exc, FeedPositionExpired):
        return _status(
            code_pb2.OUT_OF_RANGE, str(exc), "FEED_POSITION_EXPIRED", oldest_position=exc.oldest_position
        )
    if isinstance(exc, ServerDraining):
        return _status(code_pb2.UNAVAILABLE, str(exc), "SERVER_DRAINING")
    if isinstance(exc, StorageFull):
        return _status(code_pb2.RESOURCE_EXHAUSTED, str(exc), "STORAGE_FULL")
    if isinstance(exc, CommitOutcomeUnknown):
        return _status(code_pb2.UNAVAILABLE, str(exc), "COMMIT_OUTCOME_UNKNOWN")
    if isinstance(exc, StorageUnavailable):
        return _status(code_pb2.UNAVAILABLE, str(exc), "STORAGE_UNAVAILABLE")
    log.error("api.internal_error", error_class=type(exc).__name__, exc_info=exc)
    return _status(code_pb2.INTERNAL, "internal error", "INTERNAL")


def _status(code: int, message: str, reason: str, *details: object, **metadata: str) -> grpc.Status:
    packed = []
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)
    for detail in (info, *details):
        any_detail = any_pb2.Any()
        any_detail.Pack(detail)  # type: ignore[arg-type]
        packed.append(any_detail)
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=packed))

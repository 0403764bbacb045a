"""Turn requests into domain inputs, or INVALID_ARGUMENT naming the field."""

from __future__ import annotations

from collections.abc import Callable

from leasehold._server.api.convert import STATUS_FROM_PROTO, struct_to_dict
from leasehold._server.jobs import limits
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import JobFilter, JsonObject, NewJob
from leasehold.v1 import jobs_pb2

RESOURCE_LIMIT = 256
JOB_ID_LIMIT = 256
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# Items per BatchEnqueue: a batch is one transaction, and its rows hold the
# writer (and, on SQLite, the database's one write lock) while it runs.
BATCH_ENQUEUE_LIMIT = 1000


def new_job(owner_id: str, request: jobs_pb2.EnqueueRequest, serves: Callable[[str], bool]) -> NewJob:
    """`serves(kind)`: whether a local handler or a remote-kind pattern serves it."""
    if not limits.is_valid_kind(request.kind):
        raise InvalidArgument("kind", "must be 1-128 characters of [a-z0-9._-]")
    if not serves(request.kind):
        raise InvalidArgument("kind", f"no handler is registered for kind {request.kind!r}")
    _bounded("resource_type", request.resource_type, RESOURCE_LIMIT)
    _bounded("resource_id", request.resource_id, RESOURCE_LIMIT)
    if request.resource_id and not request.resource_type:
        raise InvalidArgument("resource_type", "is required when resource_id is set")
    return NewJob(
        owner_id=owner_id,
        kind=request.kind,
        resource_type=request.resource_type,
        resource_id=request.resource_id,
        payload=payload(request),
        max_attempts=_limit(
            "max_attempts", request.max_attempts, limits.DEFAULT_MAX_ATTEMPTS, limits.MAX_ATTEMPTS_LIMIT
        ),
        timeout_seconds=_limit(
            "timeout_seconds",
            request.timeout_seconds,
            limits.DEFAULT_TIMEOUT_SECONDS,
            limits.TIMEOUT_SECONDS_LIMIT,
        ),
    )


def new_jobs(
    owner_id: str, request: jobs_pb2.BatchEnqueueRequest, serves: Callable[[str], bool]
) -> list[NewJob]:
    """Every item checked by `new_job`'s own rules, so that a batch refuses what
    Enqueue refuses, with the same words; the field is named by its place in the
    batch (`requests[3].kind`), so the caller knows which item to fix."""
    count = len(request.requests)
    if not 1 <= count <= BATCH_ENQUEUE_LIMIT:
        raise InvalidArgument("requests", f"must hold 1-{BATCH_ENQUEUE_LIMIT} items (got {count})")
    checked = []
    for index, item in enumerate(request.requests):
        try:
            checked.append(new_job(owner_id, item, serves))
        except InvalidArgument as exc:
            raise InvalidArgument(f"requests[{index}].{exc.field}", exc.description) from None
    return checked


def payload(request: jobs_pb2.EnqueueRequest) -> JsonObject:
    size = request.payload.ByteSize()
    if size > limits.PAYLOAD_BYTES_LIMIT:
        raise InvalidArgument("payload", f"must be at most {limits.PAYLOAD_BYTES_LIMIT} bytes serialized")
    try:
        value = struct_to_dict(request.payload)
    except ValueError:  # protobuf refuses NaN and Infinity in JSON form
        raise InvalidArgument("payload", "numbers must be finite (no NaN or Infinity)") from None
    limits.check_payload(value, serialized_bytes=size)
    return value


def job_id(value: str) -> str:
    return job_id_field("job_id", value)


def job_id_field(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    _bounded(field, value, JOB_ID_LIMIT)
    return value


def page_size(value: int) -> int:
    if value < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(value or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def job_filter(request: jobs_pb2.ListRequest) -> JobFilter:
    statuses = set()
    for status in request.statuses:
        if status not in STATUS_FROM_PROTO:
            raise InvalidArgument("statuses", f"unknown or unspecified status {status}")
        statuses.add(STATUS_FROM_PROTO[status])
    _bounded("kind", request.kind, 128)
    _bounded("resource_type", request.resource_type, RESOURCE_LIMIT)
    _bounded("resource_id", request.resource_id, RESOURCE_LIMIT)
    return JobFilter(
        statuses=frozenset(statuses),
        kind=request.kind,
        resource_type=request.resource_type,
        resource_id=request.resource_id,
    )


def after_sequence(value: int) -> int:
    if value < 0:
        raise InvalidArgument("after_sequence", "must not be negative")
    return value


def _bounded(field: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidArgument(field, f"must be at most {limit} characters")
    if limits.NUL in value:
        # PostgreSQL text cannot hold it; refused on every engine so that both
        # answer alike (and a NUL id is malformed whoever asks, so this says
        # nothing about other owners' jobs).
        raise InvalidArgument(field, "must not contain NUL characters")


def _limit(field: str, value: int, default: int, maximum: int) -> int:
    if value == 0:
        return default
    if not 1 <= value <= maximum:
        raise InvalidArgument(field, f"must be between 1 and {maximum} (0 means {default})")
    return value

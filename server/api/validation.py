"""Turn requests into domain inputs, or INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from leasehold._server.api.convert import PARENT_FAILURE_FROM_PROTO, STATUS_FROM_PROTO, struct_to_dict
from leasehold._server.jobs import dependencies, limits, owner_feed, state_machine
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import (
    DEFAULT_PRIORITY,
    PRIORITIES,
    JobFilter,
    JsonObject,
    NewJob,
    ParentFailurePolicy,
    RetryPolicy,
)
from leasehold._server.jobs.routing import ServedKinds
from leasehold.v1 import jobs_pb2

RESOURCE_LIMIT = 256
# Resource types the service names itself (a schedule's firings): a caller's
# own Enqueue could otherwise take a firing's key before it fires.
RESERVED_RESOURCE_PREFIX = "leasehold."
JOB_ID_LIMIT = 256
REQUEST_ID_LIMIT = 128
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# Items per BatchEnqueue: a batch is one transaction, and its rows hold the
# writer (and, on SQLite, the database's one write lock) while it runs.
BATCH_ENQUEUE_LIMIT = 1000
# How far ahead run_at may be: a job service is no calendar, and a typo in a
# year should be refused rather than sit in the queue for a decade.
RUN_AT_HORIZON = timedelta(days=365)
# A retry policy's longest wait, and its steepest growth.
MAX_RETRY_INTERVAL_SECONDS = 365 * 86_400.0
MAX_BACKOFF_COEFFICIENT = 100.0
DEFAULT_INITIAL_INTERVAL_SECONDS = 1.0
DEFAULT_BACKOFF_COEFFICIENT = 2.0
# With no max_interval_seconds, the longest wait is this many initial intervals.
DEFAULT_MAX_INTERVALS = 100
NON_RETRYABLE_TYPES_LIMIT = 32


def new_job(
    owner_id: str,
    request: jobs_pb2.EnqueueRequest,
    serves: ServedKinds,
    now: datetime,
    traceparent: str | None = None,
    *,
    in_batch: bool = False,
) -> NewJob:
    """`serves(kind)`: whether a local handler or a remote-kind pattern serves
    it; `now`: the server's time, which run_at is checked against;
    `traceparent`: the call's, already checked (`trace_context`); `in_batch`:
    the request is an item of a BatchEnqueue, the only place `ref` and
    `depends_on_refs` mean something (`new_jobs` resolves them)."""
    if not limits.is_valid_kind(request.kind):
        raise InvalidArgument("kind", "must be 1-128 characters of [a-z0-9._-]")
    if not serves(request.kind):
        raise InvalidArgument("kind", serves.refusal(request.kind))
    _bounded("resource_type", request.resource_type, RESOURCE_LIMIT)
    _bounded("resource_id", request.resource_id, RESOURCE_LIMIT)
    if request.resource_id and not request.resource_type:
        raise InvalidArgument("resource_type", "is required when resource_id is set")
    if request.resource_type.startswith(RESERVED_RESOURCE_PREFIX):
        raise InvalidArgument(
            "resource_type", f"types starting {RESERVED_RESOURCE_PREFIX!r} are reserved (schedules use them)"
        )
    if not in_batch:
        refs_only_in_batches(request)
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
        run_at=run_at(request, now),
        priority=priority(request.priority),
        retry_policy=retry_policy(request) if request.HasField("retry_policy") else None,
        traceparent=traceparent,
        depends_on=depends_on(request.depends_on),
        on_parent_failure=parent_failure_policy(request.on_parent_failure),
    )


def refs_only_in_batches(request: jobs_pb2.EnqueueRequest) -> None:
    """A plain Enqueue has no other items to name or be named by: a ref there
    would be silently meaningless, so it is refused rather than ignored."""
    if request.ref:
        raise InvalidArgument(
            "ref", "is only for items of a BatchEnqueue (other items' depends_on_refs name it)"
        )
    if request.depends_on_refs:
        raise InvalidArgument(
            "depends_on_refs", "is only for items of a BatchEnqueue; name existing jobs in depends_on"
        )


def depends_on(job_ids: Sequence[str]) -> tuple[str, ...]:
    """The parents an Enqueue names: at most `dependencies.MAX_PARENTS`, each
    an id as Get takes one, none twice (a repeat is a mistake the caller would
    want to hear of, not a job that waits twice). Whether each names a job of
    the caller's is the repository's to say, in the transaction that links
    them, with the same words for an unknown id and another owner's."""
    if len(job_ids) > dependencies.MAX_PARENTS:
        raise InvalidArgument(
            "depends_on", f"must name at most {dependencies.MAX_PARENTS} jobs (got {len(job_ids)})"
        )
    first: dict[str, int] = {}
    for index, value in enumerate(job_ids):
        field = f"depends_on[{index}]"
        job_id_field(field, value)
        if value in first:
            raise InvalidArgument(field, f"repeats depends_on[{first[value]}]")
        first[value] = index
    return tuple(job_ids)


def parent_failure_policy(value: int) -> ParentFailurePolicy:
    """UNSPECIFIED is CANCEL: a child whose input never came is not run on a
    guess unless its caller asked for that."""
    policy = PARENT_FAILURE_FROM_PROTO.get(value)
    if policy is None:
        raise InvalidArgument(
            "on_parent_failure",
            f"unknown policy {value} (PARENT_FAILURE_POLICY_CANCEL or PARENT_FAILURE_POLICY_RUN)",
        )
    return policy


def run_at(request: jobs_pb2.EnqueueRequest, now: datetime) -> datetime | None:
    if not request.HasField("run_at"):
        return None
    stamp = request.run_at
    if not 0 <= stamp.nanos < 1_000_000_000:
        raise InvalidArgument("run_at", "nanos must be 0-999999999")
    try:
        moment = stamp.ToDatetime(tzinfo=now.tzinfo)
    except (ValueError, OverflowError):
        raise InvalidArgument("run_at", "is not a valid timestamp") from None
    if moment > now + RUN_AT_HORIZON:
        raise InvalidArgument("run_at", f"must be at most {RUN_AT_HORIZON.days} days ahead")
    return moment


def priority(value: int) -> int:
    if value == 0:
        return DEFAULT_PRIORITY
    if value not in PRIORITIES:
        raise InvalidArgument(
            "priority", f"must be between {PRIORITIES[0]} and {PRIORITIES[-1]} (0 means {DEFAULT_PRIORITY})"
        )
    return value


def retry_policy(request: jobs_pb2.EnqueueRequest) -> RetryPolicy:
    policy = request.retry_policy
    initial = _interval("retry_policy.initial_interval_seconds", policy.initial_interval_seconds)
    initial = initial or DEFAULT_INITIAL_INTERVAL_SECONDS
    coefficient = policy.backoff_coefficient
    if coefficient == 0:
        coefficient = DEFAULT_BACKOFF_COEFFICIENT
    elif not 1 <= coefficient <= MAX_BACKOFF_COEFFICIENT:  # also refuses NaN
        raise InvalidArgument(
            "retry_policy.backoff_coefficient",
            f"must be between 1 and {MAX_BACKOFF_COEFFICIENT:g} (0 means {DEFAULT_BACKOFF_COEFFICIENT:g})",
        )
    maximum = _interval("retry_policy.max_interval_seconds", policy.max_interval_seconds)
    if maximum == 0:
        maximum = min(initial * DEFAULT_MAX_INTERVALS, MAX_RETRY_INTERVAL_SECONDS)
    elif maximum < initial:
        raise InvalidArgument(
            "retry_policy.max_interval_seconds", "must not be less than initial_interval_seconds"
        )
    names = list(policy.non_retryable_error_types)
    if len(names) > NON_RETRYABLE_TYPES_LIMIT:
        raise InvalidArgument(
            "retry_policy.non_retryable_error_types", f"must hold at most {NON_RETRYABLE_TYPES_LIMIT} names"
        )
    for index, name in enumerate(names):
        field = f"retry_policy.non_retryable_error_types[{index}]"
        if not 1 <= len(name) <= limits.ERROR_TYPE_LIMIT:
            raise InvalidArgument(field, f"must be 1-{limits.ERROR_TYPE_LIMIT} characters")
        if limits.NUL in name or state_machine.ERROR_TYPE_SEPARATOR in name:
            raise InvalidArgument(field, "must not contain NUL or U+001F characters")
    return RetryPolicy(
        initial_interval_seconds=initial,
        backoff_coefficient=coefficient,
        max_interval_seconds=maximum,
        non_retryable_error_types=tuple(dict.fromkeys(names)),
    )


def _interval(field: str, value: float) -> float:
    """A retry wait in seconds: 0 (the default) or more than 0 and at most a year."""
    if value == 0:
        return 0.0
    if not (math.isfinite(value) and 0 < value <= MAX_RETRY_INTERVAL_SECONDS):
        raise InvalidArgument(
            field, f"must be more than 0 and at most {MAX_RETRY_INTERVAL_SECONDS:g} seconds"
        )
    return value


def new_jobs(
    owner_id: str,
    request: jobs_pb2.BatchEnqueueRequest,
    serves: ServedKinds,
    now: datetime,
    traceparent: str | None = None,
) -> list[NewJob]:
    """Every item checked by `new_job`'s own rules, so that a batch refuses what
    Enqueue refuses, with the same words; the field is named by its place in the
    batch (`requests[3].kind`), so the caller knows which item to fix. The
    call's one traceparent goes with every item. Then the items' refs are
    resolved to the places of the items they name (`NewJob.depends_on_items`),
    once every item is known to be sound on its own, so a graph's faults (a
    cycle, a ref naming no item) are found before anything is written."""
    count = len(request.requests)
    if not 1 <= count <= BATCH_ENQUEUE_LIMIT:
        raise InvalidArgument("requests", f"must hold 1-{BATCH_ENQUEUE_LIMIT} items (got {count})")
    checked = []
    for index, item in enumerate(request.requests):
        if item.request_id:
            # One batch is one call: its one key is the batch's own field.
            raise InvalidArgument(
                f"requests[{index}].request_id", "must be empty (set the batch's own request_id)"
            )
        try:
            checked.append(new_job(owner_id, item, serves, now, traceparent, in_batch=True))
        except InvalidArgument as exc:
            raise InvalidArgument(f"requests[{index}].{exc.field}", exc.description) from None
    if not any(item.ref or item.depends_on_refs for item in request.requests):
        return checked
    parents = dependencies.resolve_refs(
        [(item.ref, item.depends_on_refs, len(item.depends_on)) for item in request.requests]
    )
    return [
        replace(job, depends_on_items=items) if items else job
        for job, items in zip(checked, parents, strict=True)
    ]


def request_id(value: str) -> str | None:
    """An AIP-155 request id: 1-128 printable ASCII characters; empty is none
    (the call is not idempotent)."""
    if not value:
        return None
    if len(value) > REQUEST_ID_LIMIT:
        raise InvalidArgument("request_id", f"must be at most {REQUEST_ID_LIMIT} characters")
    if not all(" " <= char <= "~" for char in value):
        raise InvalidArgument("request_id", "must be printable ASCII characters (U+0020-U+007E)")
    return value


def payload(request: jobs_pb2.EnqueueRequest) -> JsonObject:
    size = request.payload.ByteSize()
    if size > limits.PAYLOAD_BYTES_LIMIT:
        raise InvalidArgument("payload", f"must be at most {limits.PAYLOAD_BYTES_LIMIT} bytes serialized")
    try:
        value = struct_to_dict(request.payload, "payload")
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
    if request.depends_on:
        # Any id as Get takes one: a job that is not the caller's simply has
        # no children the caller can see, as an unknown one has none.
        _bounded("depends_on", request.depends_on, JOB_ID_LIMIT)
    return JobFilter(
        statuses=frozenset(statuses),
        kind=request.kind,
        resource_type=request.resource_type,
        resource_id=request.resource_id,
        depends_on=request.depends_on,
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


FEED_FILTER_VALUES_LIMIT = 100


def subscribe_request(request: jobs_pb2.SubscribeRequest) -> tuple[int | None, owner_feed.FeedFilter]:
    """Where the feed starts (None: from the oldest kept event) and what it
    carries, checked before anything is read."""
    if len(request.kinds) > FEED_FILTER_VALUES_LIMIT:
        raise InvalidArgument("kinds", f"at most {FEED_FILTER_VALUES_LIMIT} kinds")
    for index, kind in enumerate(request.kinds):
        if not limits.is_valid_kind(kind):
            raise InvalidArgument(f"kinds[{index}]", "must be 1-128 characters of [a-z0-9._-]")
    if len(request.event_types) > FEED_FILTER_VALUES_LIMIT:
        raise InvalidArgument("event_types", f"at most {FEED_FILTER_VALUES_LIMIT} event types")
    for index, event_type in enumerate(request.event_types):
        if not event_type or len(event_type) > limits.EVENT_TYPE_LIMIT:
            raise InvalidArgument(f"event_types[{index}]", f"must be 1-{limits.EVENT_TYPE_LIMIT} characters")
        _bounded(f"event_types[{index}]", event_type, limits.EVENT_TYPE_LIMIT)
    _bounded("resource_type", request.resource_type, RESOURCE_LIMIT)
    after: int | None = None
    if request.after_position:
        if request.tail:
            raise InvalidArgument("after_position", "must be empty when tail is set (tail starts at the end)")
        after = owner_feed.decode_position(request.after_position)
    return after, owner_feed.FeedFilter(
        kinds=frozenset(request.kinds),
        resource_type=request.resource_type,
        event_types=frozenset(request.event_types),
    )

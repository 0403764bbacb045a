"""WorkerService requests to domain inputs, or INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import math
from dataclasses import dataclass

from google.protobuf import struct_pb2

from leasehold._server.api import validation
from leasehold._server.api.convert import struct_to_dict
from leasehold._server.jobs import limits
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import JsonObject, Lease
from leasehold._server.jobs.routing import KindFilter, KindPatterns
from leasehold._server.runtime.long_poll import ClaimRequest
from leasehold.v1 import worker_pb2

WORKER_ID_LIMIT = 128
MAX_CLAIM_KINDS = 100
MAX_JOBS_LIMIT = 100
MAX_WAIT_SECONDS = 60.0
MAX_HEARTBEAT_LEASES = 1000
MAX_FINISH_OUTCOMES = 1000
MAX_DELAY_SECONDS = 86_400.0
LEASE_TOKEN_LIMIT = 64


def claim(request: worker_pb2.ClaimRequest, remote_kinds: KindPatterns) -> ClaimRequest:
    if not request.worker_id:
        raise InvalidArgument("worker_id", "is required")
    _text("worker_id", request.worker_id, WORKER_ID_LIMIT)
    if not request.kinds:
        raise InvalidArgument("kinds", "must name at least one kind")
    if len(request.kinds) > MAX_CLAIM_KINDS:
        raise InvalidArgument("kinds", f"must name at most {MAX_CLAIM_KINDS} kinds")
    for index, kind in enumerate(request.kinds):
        field = f"kinds[{index}]"
        if not limits.is_valid_kind(kind):
            raise InvalidArgument(field, "must be 1-128 characters of [a-z0-9._-]")
        if not remote_kinds.matches(kind):
            raise InvalidArgument(field, f"{kind!r} is not routed to remote workers (serve --remote-kinds)")
    if not 0 <= request.max_jobs <= MAX_JOBS_LIMIT:
        raise InvalidArgument("max_jobs", f"must be between 1 and {MAX_JOBS_LIMIT} (0 means 1)")
    wait = request.wait_seconds
    if not 0 <= wait <= MAX_WAIT_SECONDS:  # also refuses NaN
        raise InvalidArgument("wait_seconds", f"must be between 0 and {MAX_WAIT_SECONDS:g}")
    if len(request.held_leases) > MAX_HEARTBEAT_LEASES:
        raise InvalidArgument("held_leases", f"must name at most {MAX_HEARTBEAT_LEASES} leases")
    held = tuple(
        lease(ref.job_id, ref.lease_token, field_prefix=f"held_leases[{index}].")
        for index, ref in enumerate(request.held_leases)
    )
    return ClaimRequest(
        worker_id=request.worker_id,
        kinds=KindFilter(only=frozenset(request.kinds)),
        limit=request.max_jobs or 1,
        wait_seconds=wait,
        held=held,
    )


def lease(job_id: str, lease_token: str, field_prefix: str = "") -> Lease:
    """The attempt a write names. Its attempt number is not needed: fencing is
    by token alone, and a remote Fail's backoff comes from the job's row."""
    validation.job_id_field(field_prefix + "job_id", job_id)
    if not lease_token:
        raise InvalidArgument(field_prefix + "lease_token", "is required")
    _text(field_prefix + "lease_token", lease_token, LEASE_TOKEN_LIMIT)
    return Lease(job_id=job_id, token=lease_token, attempt=0)


@dataclass(frozen=True)
class HeartbeatRef:
    """One lease a Heartbeat renews, with the checkpoint it saves (None: it
    keeps the one saved before)."""

    lease: Lease
    checkpoint: JsonObject | None


def heartbeat(request: worker_pb2.HeartbeatRequest) -> list[HeartbeatRef]:
    """Every lease and checkpoint checked before any is renewed or saved, so a
    bad checkpoint refuses the whole call and nothing of it is written."""
    if not request.leases:
        raise InvalidArgument("leases", "must name at least one lease")
    if len(request.leases) > MAX_HEARTBEAT_LEASES:
        raise InvalidArgument("leases", f"must name at most {MAX_HEARTBEAT_LEASES} leases")
    return [
        HeartbeatRef(
            lease(ref.job_id, ref.lease_token, field_prefix=f"leases[{index}]."),
            struct(f"leases[{index}].checkpoint", ref.checkpoint) if ref.HasField("checkpoint") else None,
        )
        for index, ref in enumerate(request.leases)
    ]


def event_type(value: str) -> str:
    limits.check_event_type(value, field="type")
    return value


def struct(field: str, value: struct_pb2.Struct) -> JsonObject:
    size = value.ByteSize()
    if size > limits.PAYLOAD_BYTES_LIMIT:
        raise InvalidArgument(field, f"must be at most {limits.PAYLOAD_BYTES_LIMIT} bytes serialized")
    try:
        decoded = struct_to_dict(value, field)
    except ValueError:  # protobuf refuses NaN and Infinity in JSON form
        raise InvalidArgument(field, "numbers must be finite (no NaN or Infinity)") from None
    limits.check_payload(decoded, field=field, serialized_bytes=size)
    return decoded


def seconds(field: str, value: float, *, zero_allowed: bool) -> float | None:
    """A delay of 1-86400 seconds (or 0, meaning none, where allowed)."""
    if zero_allowed and value == 0:
        return None
    if not 1 <= value <= MAX_DELAY_SECONDS or math.isnan(value):
        zero = " (0 means the job's backoff)" if zero_allowed else ""
        raise InvalidArgument(field, f"must be between 1 and {MAX_DELAY_SECONDS:g} seconds{zero}")
    return value


def error_type(value: str) -> str:
    if len(value) > limits.ERROR_TYPE_LIMIT:
        raise InvalidArgument("error_type", f"must be at most {limits.ERROR_TYPE_LIMIT} characters")
    return value


def _text(field: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidArgument(field, f"must be at most {limit} characters")
    if limits.NUL in value:
        raise InvalidArgument(field, "must not contain NUL characters")


def finish(request: worker_pb2.FinishRequest) -> list[worker_pb2.Outcome]:
    """The outcomes of a Finish, bounded, each naming a different job and each
    one of the four writes. What is wrong inside one outcome is its own answer
    (the servicer names it there); what is wrong with the call refuses it."""
    outcomes = list(request.outcomes)
    if not outcomes:
        raise InvalidArgument("outcomes", "must hold at least one outcome")
    if len(outcomes) > MAX_FINISH_OUTCOMES:
        raise InvalidArgument("outcomes", f"must hold at most {MAX_FINISH_OUTCOMES} outcomes")
    seen: set[str] = set()
    for index, outcome in enumerate(outcomes):
        which = outcome.WhichOneof("outcome")
        if which is None:
            raise InvalidArgument(
                f"outcomes[{index}]", "must set one of complete, fail, snooze, confirm_cancel"
            )
        job_id = getattr(outcome, which).job_id
        if job_id in seen:
            raise InvalidArgument(f"outcomes[{index}].{which}.job_id", "names a job another outcome names")
        seen.add(job_id)
    return outcomes

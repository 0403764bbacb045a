"""AdminService requests into domain inputs, or INVALID_ARGUMENT naming the field.

The same rules as JobService's: a kind is Enqueue's kind, page sizes are
List's, and a filter's texts are bounded as List's are."""

from __future__ import annotations

import hashlib
import json

from leasehold._server.api import validation
from leasehold._server.api.convert import STATUS_FROM_PROTO
from leasehold._server.jobs import limits
from leasehold._server.jobs.admin import AdminFilter
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import JobFilter, JobStatus
from leasehold.v1 import admin_pb2

OWNER_ID_LIMIT = 128


def kind(value: str, field: str = "kind") -> str:
    """A kind as Enqueue takes it; PauseKind may name a kind no handler serves
    yet (a paused kind stays paused for the handler deployed later)."""
    if not limits.is_valid_kind(value):
        raise InvalidArgument(field, "must be 1-128 characters of [a-z0-9._-]")
    return value


def confirmed(job_filter: AdminFilter, dry_run: bool, confirm_all: bool) -> None:
    """A bulk action that would act on every owner's jobs must say so."""
    if job_filter.matches_every_owner_everything and not dry_run and not confirm_all:
        raise InvalidArgument(
            "confirm_all",
            "a filter naming no kind, owner or resource matches every owner's jobs: set confirm_all "
            "to act on all of them, or narrow the filter (dry_run counts what it would touch)",
        )


def job_filter(
    request: admin_pb2.JobFilter, allowed: frozenset[JobStatus], field: str = "filter"
) -> AdminFilter:
    """`request` as a filter; `allowed`: the statuses this RPC may select
    (every status for a listing). No status is left empty: every status for a
    listing, every allowed one for a bulk action (the caller says which)."""
    statuses = set()
    for status in request.statuses:
        found = STATUS_FROM_PROTO.get(status)
        if found is None:
            raise InvalidArgument(f"{field}.statuses", f"unknown or unspecified status {status}")
        if found not in allowed:
            names = ", ".join(sorted(s.name for s in allowed))
            raise InvalidArgument(f"{field}.statuses", f"{found.name} is not allowed here (only {names})")
        statuses.add(found)
    if request.kind:
        kind(request.kind, f"{field}.kind")
    for name, value, limit in (
        ("owner_id", request.owner_id, OWNER_ID_LIMIT),
        ("resource_type", request.resource_type, validation.RESOURCE_LIMIT),
        ("resource_id", request.resource_id, validation.RESOURCE_LIMIT),
    ):
        if len(value) > limit:
            raise InvalidArgument(f"{field}.{name}", f"must be at most {limit} characters")
        if limits.NUL in value:
            raise InvalidArgument(f"{field}.{name}", "must not contain NUL characters")
    return AdminFilter(
        jobs=JobFilter(
            statuses=frozenset(statuses),
            kind=request.kind,
            resource_type=request.resource_type,
            resource_id=request.resource_id,
        ),
        owner_id=request.owner_id,
    )


def filter_scope(job_filter: AdminFilter) -> str:
    """What a ListAllJobs page token is bound to: a digest of the whole filter."""
    canonical = json.dumps(
        [
            sorted(status.value for status in job_filter.jobs.statuses),
            job_filter.jobs.kind,
            job_filter.owner_id,
            job_filter.jobs.resource_type,
            job_filter.jobs.resource_id,
        ]
    )
    return "admin:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

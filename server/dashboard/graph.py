"""A job's place in its graph, for its page: the parents it waits for (each
read with Get, as the page's own credential may) and the first page of its
children (List's `depends_on` filter), each with its status; and what a
queued job is waiting for, in words."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import grpc

from leasehold._server.dashboard.stats import status_name
from leasehold.v1 import jobs_pb2

# Children listed on the page; more are a link to the jobs table filtered to them.
CHILDREN_SHOWN = 50
# Parents read at once: a job may have 100, and the owner's calls in flight
# are limited (--max-calls-per-owner), so one page view takes only a few.
PARENT_READS_AT_ONCE = 8
# A parent the API no longer has: retention may delete it once no child waits.
_GONE = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)

# What a queued job waits for, by Get's wait_reason (dependencies is counted).
_WAITING = {
    jobs_pb2.WAIT_REASON_SCHEDULED: "its run time",
    jobs_pb2.WAIT_REASON_BACKOFF: "its retry backoff",
    jobs_pb2.WAIT_REASON_KIND_LIMIT: "its kind's limit of running jobs",
    jobs_pb2.WAIT_REASON_OWNER_LIMIT: "its owner's limit of running jobs",
    jobs_pb2.WAIT_REASON_RATE_LIMIT: "its kind's start rate",
    jobs_pb2.WAIT_REASON_PAUSED: "its kind to be resumed",
    jobs_pb2.WAIT_REASON_NO_WORKER: "a remote worker for its kind",
    jobs_pb2.WAIT_REASON_READY: "a free slot",
}


class JobReads(Protocol):
    """The reads a job page's graph takes (leasehold.client.Client's)."""

    async def get(self, job_id: str) -> jobs_pb2.Job: ...

    async def list_page(self, *, depends_on: str = "", page_size: int = 0) -> jobs_pb2.ListResponse: ...


@dataclass(frozen=True)
class Relative:
    """A parent or child as its page lists it; `status` is None for a parent
    the API no longer has."""

    id: str
    status: str | None


@dataclass(frozen=True)
class Relatives:
    parents: list[Relative]
    children: list[Relative]
    # More children than the page lists.
    more_children: bool
    # What its parents' outcomes do to it (on_parent_failure), in words.
    rule: str


def waiting_for(job: jobs_pb2.Job) -> str:
    """`waiting for 2 parents`, `waiting for a free slot`, ...: why a queued
    job is not running yet; empty for any other job or an unknown reason."""
    if status_name(job.status) != "queued":
        return ""
    if job.wait_reason == jobs_pb2.WAIT_REASON_DEPENDENCIES or job.pending_dependencies > 0:
        count = job.pending_dependencies
        return f"waiting for {count} parent{'' if count == 1 else 's'}"
    reason = _WAITING.get(job.wait_reason)
    return f"waiting for {reason}" if reason else ""


async def relatives(client: JobReads, job: jobs_pb2.Job) -> Relatives:
    """The job's parents in the order it gave them, and its newest children."""
    gate = asyncio.Semaphore(PARENT_READS_AT_ONCE)
    parents, page = await asyncio.gather(
        asyncio.gather(*(_parent(client, gate, parent) for parent in job.depends_on)),
        client.list_page(depends_on=job.id, page_size=CHILDREN_SHOWN),
    )
    children = [Relative(child.id, status_name(child.status)) for child in page.jobs]
    return Relatives(list(parents), children, bool(page.next_page_token), parent_rule(job))


def parent_rule(job: jobs_pb2.Job) -> str:
    if job.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_RUN:
        return "It runs once every parent has ended, whatever the outcome."
    # CANCEL, and unset, which the service takes as CANCEL.
    return "It runs once every parent has succeeded; a parent that fails or is cancelled cancels it."


async def _parent(client: JobReads, gate: asyncio.Semaphore, job_id: str) -> Relative:
    async with gate:
        try:
            found = await client.get(job_id)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _GONE:
                raise
            return Relative(job_id, None)
    return Relative(job_id, status_name(found.status))

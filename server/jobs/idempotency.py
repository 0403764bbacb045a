"""Idempotent calls (AIP-155, DESIGN §14): what a request id names, how long it
is remembered, and how a repeat is answered.

An owner's Enqueue, BatchEnqueue or Retry may carry a request id. The first
call with it acts and leaves a record, in the same transaction as its jobs:
which method it was, a fingerprint of its request, and its answer (each job's
id and `created` flag). A repeat from the same owner is answered from that
record (the same jobs as they are now, with the first call's flags) and acts
no more. Storage engines keep the records; this module decides what a record
means, so that every engine answers a repeat alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from leasehold._server.jobs.errors import RequestIdReused, RequestResultDeleted
from leasehold._server.jobs.records import Job

# How long a request id is remembered at least. A client retrying after a
# network failure, a deploy or a night's outage still gets its first answer;
# the sweep then forgets the key within one more round (`RetentionSweeper`).
# Shorter than the default retention (7 days), so a repeat within the window
# normally finds its jobs still there.
REQUEST_ID_WINDOW = timedelta(hours=24)


class Method(StrEnum):
    """The calls that take a request id, as the record names them."""

    ENQUEUE = "enqueue"
    BATCH_ENQUEUE = "batch_enqueue"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class RequestKey:
    """One owner's request id on one call. `fingerprint`: a digest of the whole
    request (the API layer computes it), so a key sent again with another
    request is told apart from a repeat."""

    owner_id: str
    request_id: str
    method: Method
    fingerprint: str


Answer = tuple[Job, bool]


@dataclass(frozen=True, slots=True)
class KeyedAnswer:
    """What a call with a request id answered: its jobs with their `created`
    flags, in the order of the request, and whether it was a repeat answered
    from the first call's record (then nothing was written)."""

    answers: list[Answer]
    repeated: bool


def record(answers: Sequence[Answer]) -> list[dict[str, Any]]:
    """The stored form of a first call's answer (a JSON list)."""
    return [{"job_id": job.id, "created": created} for job, created in answers]


def recorded_job_ids(stored: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(item["job_id"]) for item in stored]


def replay(
    key: RequestKey,
    method: str,
    fingerprint: str,
    stored: Sequence[Mapping[str, Any]],
    jobs: Mapping[str, Job],
) -> KeyedAnswer:
    """A repeat's answer from the first call's record (`method`, `fingerprint`,
    `stored`) and the owner's jobs it names as they are now (`jobs`, by id).
    A key sent with another request is refused; so is a repeat whose jobs
    retention has since deleted: the key still stands, and a second job is
    never made for it."""
    if method != key.method or fingerprint != key.fingerprint:
        raise RequestIdReused(key.request_id)
    answers = []
    for item in stored:
        job = jobs.get(str(item["job_id"]))
        if job is None:
            raise RequestResultDeleted(key.request_id)
        answers.append((job, bool(item["created"])))
    return KeyedAnswer(answers, repeated=True)

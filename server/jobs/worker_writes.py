"""Worker writes that can be sent twice (worker protocol 2, DESIGN §22): what a
lease token's writes leave behind, and how a repeat is answered.

A remote worker whose reply was lost cannot know whether its write landed, so
it sends it again. Two writes get a record, each in the transaction of the
write itself (so it survives a restart and every replica reads it):

- A *finishing* write (Complete, Fail, Snooze, ConfirmCancel; the state
  machine's SUCCEED, FAIL, SNOOZE, CONFIRM_CANCEL) records which transition the
  token made and the job as it left it. A token makes at most one: the write
  clears the lease, so nothing of that token is fenced in again.
- An AppendEvent with a `request_id` records the event's sequence and a
  fingerprint of its type and payload.

The rule for a finishing write refused as `LeaseLost`: when its token's record
names the *same* transition, the repeat is answered with the job as the first
write left it, whatever happened to the job since (a Fail that scheduled a
retry still answers "queued, attempt 1" while attempt 2 runs). The repeat's own
arguments are not compared: the first write's stand, as they did for the job.
A record of another transition (Fail after Complete), or none (a token that
never held the job), leaves the `LeaseLost`, byte for byte the refusal a lost
lease gets, so a worker learns nothing about jobs it does not hold.

The snapshot is exact without copying the whole job: a job's identity,
payload and policy never change after its enqueue, so the record keeps only
the columns a transition can change. Its result need not be copied either: a
success is terminal, so a job that succeeded still holds the result its
Complete stored, and a job in any other status has none.

Storage engines find, lock and write the records; this module decides what a
record means, so that every engine answers a repeat alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import JobNotFound, LeaseLost, RequestIdReused
from leasehold._server.jobs.records import Job, JobEvent, JobStatus, JsonObject, Lease

if TYPE_CHECKING:
    from leasehold._server.jobs.repository import JobRepository

# The request key of a token's one finishing write (an AppendEvent's is its
# request_id, which is never empty).
FINISH_KEY = ""
APPEND_EVENT = "append_event"
FINISHING = frozenset({sm.SUCCEED.name, sm.FAIL.name, sm.SNOOZE.name, sm.CONFIRM_CANCEL.name})

# The columns of a job a transition can change, as the snapshot keeps them.
_STAMPS = ("available_at", "cancel_requested_at", "updated_at", "started_at", "completed_at")


@dataclass(frozen=True, slots=True)
class WorkerWrite:
    """One stored record. `write`: the transition's name, or `APPEND_EVENT`;
    `answer`: what a repeat is told (the job's snapshot, or the event's
    sequence); `fingerprint`: an append's type and payload digest ("" else)."""

    job_id: str
    lease_token: str
    request_key: str
    write: str
    fingerprint: str
    answer: JsonObject
    created_at: datetime

    def row(self) -> dict[str, Any]:
        """The record as an engine stores it (the `worker_writes` columns)."""
        return {
            "job_id": self.job_id,
            "lease_token": self.lease_token,
            "request_key": self.request_key,
            "write": self.write,
            "fingerprint": self.fingerprint,
            "answer": self.answer,
            "created_at": self.created_at,
        }


def finished(lease: Lease, transition: sm.Transition, job: Job, now: datetime) -> WorkerWrite:
    """The record of `transition`, made by `lease`, having left `job`."""
    if transition.name not in FINISHING:
        raise ValueError(f"{transition.name} is not a finishing write")
    snapshot: JsonObject = {
        "owner_id": job.owner_id,
        "status": job.status.value,
        "attempt": job.attempt,
        "error_message": job.error_message,
        "error_type": job.error_type,
    }
    for column in _STAMPS:
        stamp: datetime | None = getattr(job, column)
        snapshot[column] = None if stamp is None else stamp.isoformat()
    return WorkerWrite(lease.job_id, lease.token, FINISH_KEY, transition.name, "", snapshot, now)


def as_left(stored: WorkerWrite, current: Job) -> Job:
    """The job as the recorded finishing write left it: `current` (the job now,
    whose unchanging columns are the same) with the snapshot's columns."""
    snapshot = stored.answer
    status = JobStatus(snapshot["status"])
    return replace(
        current,
        status=status,
        attempt=int(snapshot["attempt"]),
        error_message=snapshot["error_message"],
        error_type=snapshot["error_type"],
        result=current.result if status is JobStatus.SUCCEEDED else None,
        available_at=_stamp(snapshot, "available_at") or current.available_at,
        cancel_requested_at=_stamp(snapshot, "cancel_requested_at"),
        updated_at=_stamp(snapshot, "updated_at") or current.updated_at,
        started_at=_stamp(snapshot, "started_at"),
        completed_at=_stamp(snapshot, "completed_at"),
    )


def _stamp(snapshot: JsonObject, column: str) -> datetime | None:
    text = snapshot[column]
    return None if text is None else datetime.fromisoformat(text)


async def finish_once(
    repository: JobRepository, lease: Lease, transition: sm.Transition, write: Callable[[], Awaitable[Job]]
) -> Job:
    """Run the finishing `write` (which must record itself, `remember=True`);
    refused as `LeaseLost`, answer it as a repeat when the token's record says
    it already made this very transition, else let the refusal stand."""
    try:
        return await write()
    except LeaseLost:
        stored = await repository.worker_write(lease, FINISH_KEY)
        if stored is None or stored.write != transition.name:
            raise
        try:
            current = await repository.get(str(stored.answer["owner_id"]), lease.job_id)
        except JobNotFound:  # deleted by retention since: nothing left to answer with
            raise LeaseLost(lease.job_id) from None
        return as_left(stored, current)


def fingerprint(event_type: str, payload: JsonObject) -> str:
    """A digest of an append's type and payload (key order does not matter)."""
    text = json.dumps([event_type, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def appended(lease: Lease, request_id: str, event: JobEvent) -> WorkerWrite:
    """The record of an AppendEvent under `request_id` that wrote `event`."""
    return WorkerWrite(
        lease.job_id,
        lease.token,
        request_id,
        APPEND_EVENT,
        fingerprint(event.type, event.payload),
        {"sequence": event.sequence},
        event.created_at,
    )


def replay_append(stored: WorkerWrite, request_id: str, event_type: str, payload: JsonObject) -> JobEvent:
    """A repeated append's answer: the first one's event (by its sequence; the
    log is not read again). The request id sent with another type or payload
    is refused as Enqueue's is (`RequestIdReused`, FAILED_PRECONDITION): it
    would otherwise be answered with an event it did not write."""
    if stored.write != APPEND_EVENT or stored.fingerprint != fingerprint(event_type, payload):
        raise RequestIdReused(request_id)
    return JobEvent(stored.job_id, int(stored.answer["sequence"]), event_type, payload, stored.created_at)

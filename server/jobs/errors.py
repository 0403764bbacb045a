"""One exception hierarchy for the whole domain.

The API layer maps these to gRPC statuses in exactly one place; nothing below it
knows what a status code is.
"""

from __future__ import annotations

from typing import TypeVar


class LeaseholdError(Exception):
    """Base of every error the domain raises on purpose."""


class InvalidArgument(LeaseholdError):
    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


class JobNotFound(LeaseholdError):
    """Unknown id, or a job of another owner: deliberately the same error."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found or not accessible")
        self.job_id = job_id


class ScheduleNotFound(LeaseholdError):
    """Unknown schedule id, or a schedule of another owner: deliberately the same error."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"schedule {schedule_id} not found or not accessible")
        self.schedule_id = schedule_id


class ScheduleExists(LeaseholdError):
    """The owner already has a schedule with this id (ids are unique per owner,
    so this says nothing about other owners)."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"schedule_id: the caller already has a schedule {schedule_id!r}")
        self.schedule_id = schedule_id


class RetryNotAllowed(LeaseholdError):
    def __init__(self, job_id: str, status: str) -> None:
        super().__init__(f"job {job_id} is {status}; only failed or cancelled jobs can be retried")
        self.job_id = job_id
        self.status = status


class KindNotServed(LeaseholdError):
    """A job cannot be retried because no handler serves its kind any more."""

    def __init__(self, kind: str, refusal: str) -> None:
        """`refusal`: the words, which name the kinds that are served (ServedKinds.refusal)."""
        super().__init__(refusal)
        self.kind = kind


class LeaseLost(LeaseholdError):
    """The caller's lease token no longer owns the running attempt."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"lease on job {job_id} was lost")
        self.job_id = job_id


class StorageUnavailable(LeaseholdError):
    """The database could not be reached or refused the write; retrying may help."""


class CommitOutcomeUnknown(StorageUnavailable):
    """The connection to the database broke while a COMMIT was on its way: the
    write may or may not have been applied, and nobody can say which until it
    is asked for again. Never answered as done, nor as undone: a retry with the
    same request_id (or, for a worker, the same write) is applied once."""


class StorageClosed(StorageUnavailable):
    """The repository is closing (the service is shutting down): retrying here is
    pointless, though another process may well succeed."""


class StorageFull(LeaseholdError):
    """The database has no room to write (disk full or quota)."""


class JobCancelled(Exception):
    """Raised inside a handler at a safe point when its job's cancel was requested."""


class PermanentError(Exception):
    """Raised by a handler to fail the job now, without using its remaining attempts."""


# The attribute `private_message` sets on an exception.
_PRIVATE_MESSAGE = "_leasehold_private_message"

_E = TypeVar("_E", bound=BaseException)


def private_message(exc: _E) -> _E:
    """Mark `exc`'s message as the job owner's alone, and return it to raise.

    Its text is still the job's `error_message` (only its owner reads that), but
    the `job.failed` log record carries its type and frames without the text, as
    `--redact-error-messages` does for every exception. For a handler whose
    error text quotes what its caller sent."""
    setattr(exc, _PRIVATE_MESSAGE, True)
    return exc


def has_private_message(exc: BaseException) -> bool:
    """Whether `private_message` marked `exc`."""
    return getattr(exc, _PRIVATE_MESSAGE, False) is True


class LimitExceeded(LeaseholdError):
    """A configured limit (named by its flag, without the dashes' `--`) refused
    the request; the caller may try again once a slot frees, or elsewhere.
    `field`: the request field whose value met the limit, when one did."""

    def __init__(self, limit: str, value: int, what: str, field: str | None = None) -> None:
        super().__init__(f"{what}: the limit {limit} ({value}) is reached")
        self.limit = limit
        self.value = value
        self.field = field


class EventLimitReached(LimitExceeded, PermanentError):
    """The job's event log holds `max-events-per-job` events: a handler's
    `append_event` is refused. Uncaught, it fails the job at once (a PermanentError):
    another attempt of the same job would meet the same full log. The job's own
    lifecycle events are never refused, so a handler that catches it can still finish."""

    def __init__(self, job_id: str, value: int) -> None:
        super().__init__("max-events-per-job", value, f"job {job_id} has no room for more events")
        self.job_id = job_id


class ServerDraining(LeaseholdError):
    """This server is shutting down (DESIGN §13). The words say what to do next
    in terms that hold for one server as for many: call again (a restarted
    server or any replica answers) and resume where you were."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the server is shutting down: {what}")


class RequestIdReused(LeaseholdError):
    """The owner's request id was first sent with another request (another
    method, or another body): answering it with that call's result would be
    answering a different question."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"request_id: {request_id!r} was already used for a different request; "
            "send a new request_id for a new request"
        )
        self.request_id = request_id


class RequestResultDeleted(LeaseholdError):
    """A repeat of a request id whose job(s) retention has since deleted: the key
    still stands (a second job is never made for it), but its answer is gone."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"request_id: {request_id!r} was already used, and the job it made has since "
            "been deleted by retention; send a new request_id to act again"
        )
        self.request_id = request_id


class FeedPositionExpired(LeaseholdError):
    """A subscriber's position is older than what retention kept: events after
    it were deleted, so resuming from it would skip them silently."""

    def __init__(self, position: str, oldest_position: str) -> None:
        super().__init__(
            f"after_position {position} has expired: retention deleted events after it; "
            f"resume after {oldest_position}, the oldest position kept, or from the oldest "
            "event kept with an empty after_position"
        )
        self.oldest_position = oldest_position

"""Which of an owner's job actions a job's status allows, so a page never
offers one the API would refuse.

The rule is the domain's own (`state_machine.owner_cancel` and `can_retry`,
the functions the service applies), read here from the proto a page has; it
is not restated.
"""

from __future__ import annotations

from dataclasses import dataclass

from leasehold._server.dashboard.stats import status_name
from leasehold._server.jobs import state_machine
from leasehold._server.jobs.records import JobStatus
from leasehold.v1 import jobs_pb2


@dataclass(frozen=True)
class JobActions:
    cancel: bool
    retry: bool

    def names(self) -> list[str]:
        """The allowed actions by name, for the job page's live updates."""
        return [name for name, allowed in (("cancel", self.cancel), ("retry", self.retry)) if allowed]


NONE = JobActions(cancel=False, retry=False)


def job_actions(job: jobs_pb2.Job) -> JobActions:
    """Cancel while queued, or running with no cancel asked yet; Retry once
    failed or cancelled; nothing for a status this dashboard does not know."""
    try:
        status = JobStatus(status_name(job.status))
    except ValueError:
        return NONE
    cancel = state_machine.owner_cancel(status, job.HasField("cancel_requested_at")) is not None
    return JobActions(cancel=cancel, retry=state_machine.can_retry(status))

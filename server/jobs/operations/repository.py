"""Every write operation of `JobRepository`, written once above the engines.

An operation reads what it needs through `Rows`, decides with the state
machine, the schedules' rules and steering, and writes through `Rows` again,
all inside one unit of work the engine opens. An engine subclasses
`OperatedRepository`, says how a unit of work runs, and implements `Rows` and
the pure reads (get, list, stats); it never decides a status, an event, a
wait or a wake-up.
"""

from __future__ import annotations

from leasehold._server.jobs.operations.attempts import AttemptOperations
from leasehold._server.jobs.operations.base import Many, Waiting
from leasehold._server.jobs.operations.schedules import ScheduleOperations
from leasehold._server.jobs.operations.upkeep import UpkeepOperations

__all__ = ["Many", "OperatedRepository", "Waiting"]


class OperatedRepository(ScheduleOperations, UpkeepOperations, AttemptOperations):
    """The operations of `JobRepository` that write; an engine adds its units
    of work and the reads."""

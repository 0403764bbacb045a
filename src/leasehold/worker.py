"""The handler API: everything a handler module needs, and nothing else.

    from leasehold.worker import HandlerRegistry, JobContext, PermanentError

    async def index_document(ctx: JobContext) -> None:
        ...

    def register(registry: HandlerRegistry) -> None:
        registry.register("myapp.index-document", index_document)

A plain `def handler(ctx)` runs in a worker thread with a `SyncJobContext`
(the same fields; `append_event` and `raise_if_cancelled` block until done),
so it may compute without awaiting while the server keeps serving.

The same module runs under `leasehold serve --handlers MODULE`, under
`leasehold worker --handlers MODULE` (or a `Worker` a Python service runs itself)
for kinds the server routes to remote workers, and is what `leasehold.testing`
exercises without a server.
"""

from leasehold._server.jobs.errors import (
    EventLimitReached,
    JobCancelled,
    LeaseLost,
    PermanentError,
    private_message,
)
from leasehold._server.remote.worker import Worker, WorkerRefused
from leasehold._server.runtime.context import JobContext, SyncJobContext
from leasehold._server.runtime.registry import Handler, HandlerRegistry

__all__ = [
    "EventLimitReached",
    "Handler",
    "HandlerRegistry",
    "JobCancelled",
    "JobContext",
    "LeaseLost",
    "PermanentError",
    "SyncJobContext",
    "Worker",
    "WorkerRefused",
    "private_message",
]

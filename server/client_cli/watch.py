"""`jobs watch`: a job's events until it ends, its `progress` events ({step, steps},
as `ctx.append_event("progress", ...)` sends them) drawn as a rich progress bar, and
the job's outcome as the exit status."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from leasehold._server.client_cli.output import Output, struct_text
from leasehold.client import Client
from leasehold.v1 import jobs_pb2

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_CANCELLED = 3
OUTCOMES = {"job.succeeded": EXIT_SUCCEEDED, "job.failed": EXIT_FAILED, "job.cancelled": EXIT_CANCELLED}
STATUS_OUTCOMES = {
    jobs_pb2.JOB_STATUS_SUCCEEDED: EXIT_SUCCEEDED,
    jobs_pb2.JOB_STATUS_FAILED: EXIT_FAILED,
    jobs_pb2.JOB_STATUS_CANCELLED: EXIT_CANCELLED,
}


async def watch(client: Client, job_id: str, after: int, out: Output) -> int:
    if out.json:
        return await _watch_json(client, job_id, after, out)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out.console) as progress:
        task = progress.add_task(job_id, total=None)
        async for event in client.watch(job_id, after_sequence=after):
            _show(progress, task, event)
            if event.type in OUTCOMES:
                return OUTCOMES[event.type]
    return await _outcome(client, job_id)


def _show(progress: Progress, task: TaskID, event: jobs_pb2.JobEvent) -> None:
    if event.type == "progress" and {"step", "steps"} <= set(event.payload.keys()):
        steps = event.payload["steps"]
        progress.update(task, total=steps if steps > 0 else None, completed=event.payload["step"])
        return
    details = struct_text(event, "payload")
    progress.console.print(f"{event.sequence:>4} {event.type} {details}".rstrip(), markup=False)
    if event.type in OUTCOMES:
        progress.update(task, description=f"{event.job_id} {event.type.removeprefix('job.')}")
    if event.type == "job.succeeded" and progress.tasks[0].total is None:
        progress.update(task, total=1, completed=1)  # no progress events: a full bar all the same


async def _watch_json(client: Client, job_id: str, after: int, out: Output) -> int:
    async for event in client.watch(job_id, after_sequence=after):
        out.message(event)
        if event.type in OUTCOMES:
            return OUTCOMES[event.type]
    return await _outcome(client, job_id)


async def _outcome(client: Client, job_id: str) -> int:
    """The stream ended with no terminal event after `after`: the job had already
    ended before it, so its status says how."""
    job = await client.get(job_id)
    return STATUS_OUTCOMES.get(job.status, EXIT_SUCCEEDED)

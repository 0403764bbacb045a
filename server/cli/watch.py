"""`jobs watch`: a job's events until it ends, its `progress` events ({step, steps},
as `ctx.append_event("progress", ...)` sends them) drawn as a rich progress bar, and
the job's outcome as the exit status.

A watch rides through a restart of the service (`Client.watch` reconnects and
resumes after the last event shown); the one line the client logs when events
flow again is shown on stderr, and nothing else is said about the break.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

import grpc
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from leasehold._server.cli import client_flags
from leasehold._server.cli.output import Output, struct_text
from leasehold.client import Client, to_dict
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
GAVE_UP = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class WatchUnreachable(Exception):
    """The service did not answer within --wait while a watch was open: exit status
    5, with a message of our own. The server's message is left out: it is written
    for whoever runs several replicas, and says nothing a user of one can act on."""


async def watch(client: Client, args: argparse.Namespace, job_id: str, after: int, out: Output) -> int:
    seen = [after]  # the last sequence shown (a cell the loops update), for the message if it gives up
    deadline = client_flags.watch_deadline(args)
    try:
        with reconnect_notices():
            if out.json:
                return await _watch_json(client, job_id, after, deadline, out, seen)
            return await _watch_bar(client, job_id, after, deadline, out, seen)
    except grpc.aio.AioRpcError as error:
        if error.code() not in GAVE_UP:
            raise
        raise WatchUnreachable(
            f"{error.code().name}: no answer from {client_flags.server(args)} within --wait "
            f"{client_flags.wait_seconds(args):g} s while watching {job_id}; "
            f"`leasehold jobs watch {job_id} --after {seen[0]}` resumes it"
        ) from None


async def _watch_bar(
    client: Client, job_id: str, after: int, deadline: float | None, out: Output, seen: list[int]
) -> int:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out.console) as progress:
        task = progress.add_task(job_id, total=None)
        async for event in client.watch(job_id, after_sequence=after, deadline_seconds=deadline):
            _show(progress, task, event)
            seen[0] = event.sequence
            if event.type in OUTCOMES:
                return OUTCOMES[event.type]
    return await _outcome(client, job_id)


def _show(progress: Progress, task: TaskID, event: jobs_pb2.JobEvent) -> None:
    payload = to_dict(event.payload)
    if event.type == "progress" and {"step", "steps"} <= set(payload):
        steps = payload["steps"]
        progress.update(task, total=steps if steps > 0 else None, completed=payload["step"])
        return
    if event.type == "job.started":
        progress.update(task, completed=0)  # a re-run attempt reports its steps from the start again
    details = struct_text(event, "payload")
    progress.console.print(f"{event.sequence:>4} {event.type} {details}".rstrip(), markup=False)
    if event.type in OUTCOMES:
        progress.update(task, description=f"{event.job_id} {event.type.removeprefix('job.')}")
    if event.type == "job.succeeded" and progress.tasks[0].total is None:
        progress.update(task, total=1, completed=1)  # no progress events: a full bar all the same


async def _watch_json(
    client: Client, job_id: str, after: int, deadline: float | None, out: Output, seen: list[int]
) -> int:
    async for event in client.watch(job_id, after_sequence=after, deadline_seconds=deadline):
        out.message(event)
        seen[0] = event.sequence
        if event.type in OUTCOMES:
            return OUTCOMES[event.type]
    return await _outcome(client, job_id)


async def _outcome(client: Client, job_id: str) -> int:
    """The stream ended with no terminal event after `after`: the job had already
    ended before it, so its status says how."""
    job = await client.get(job_id)
    return STATUS_OUTCOMES.get(job.status, EXIT_SUCCEEDED)


class _ReconnectNotice(logging.Handler):
    """The client's "reconnected to HOST:PORT, resuming after event N" as one
    `leasehold: ` line on stderr. sys.stderr is looked up at each line, so that
    under a terminal rich's live display puts it above the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"leasehold: {record.getMessage()}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def reconnect_notices() -> Iterator[None]:
    logger = logging.getLogger("leasehold.client")
    handler = _ReconnectNotice(logging.INFO)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # shown once, here, whatever else handles logging
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate

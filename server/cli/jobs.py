"""`leasehold jobs enqueue|get|list|stats|watch|follow|cancel|retry`."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass

import grpc

from leasehold._server.cli import client_values
from leasehold._server.cli.client_flags import UsageError, common_flags
from leasehold._server.cli.follow import follow
from leasehold._server.cli.output import Output, struct_text, when
from leasehold._server.cli.watch import watch
from leasehold.client import Client, to_dict
from leasehold.v1 import jobs_pb2

JOB_COLUMNS = ("ID", "KIND", "STATUS", "ATTEMPT", "RESOURCE", "CREATED")
STATS_COLUMNS = ("KIND", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
RELATIVE_COLUMNS = ("ID", "STATUS")
MAX_PAGE = 500
# How many of a job's children `jobs get` shows (a fan-out may have thousands;
# `jobs list --depends-on` walks them all).
CHILDREN_SHOWN = 100


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = commands.add_parser("jobs", help="enqueue, inspect, watch, follow, cancel and retry jobs")
    actions = jobs.add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")
    common = common_flags()

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        return actions.add_parser(name, help=help_text, parents=[common], allow_abbrev=False)

    enqueue = action("enqueue", "enqueue a job of KIND (and optionally watch it)")
    enqueue.add_argument("kind", metavar="KIND")
    enqueue.add_argument("--payload", metavar="JSON|@FILE", help="the job's input: a JSON object")
    enqueue.add_argument("--resource", metavar="TYPE/ID", help="idempotency key: one live job per resource")
    enqueue.add_argument("--run-at", metavar="TIME", help="not before this RFC 3339 time")
    enqueue.add_argument("--priority", type=int, metavar="N", help="1 (first) to 5; default 3")
    enqueue.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="JOB_ID",
        help="run only once this job of yours has succeeded (repeatable, at most 100)",
    )
    enqueue.add_argument(
        "--on-parent-failure",
        choices=("cancel", "run"),
        help="when a job it runs --after fails or is cancelled: cancel this one too (default) or run it",
    )
    enqueue.add_argument("--watch", action="store_true", help="then watch it as `jobs watch` does")
    enqueue.set_defaults(run=_enqueue)

    get = action("get", "show one job, the jobs it depends on and the jobs that depend on it")
    get.add_argument("job_id", metavar="ID")
    get.set_defaults(run=_get)

    listing = action("list", "list your jobs, newest first")
    listing.add_argument("--status", action="append", metavar="S", help="queued, running, ... (repeatable)")
    listing.add_argument("--kind", metavar="K", default="")
    listing.add_argument(
        "--depends-on", metavar="JOB_ID", default="", help="only the jobs that depend on this one"
    )
    listing.add_argument("--limit", type=int, metavar="N", help="at most N jobs (default: all)")
    listing.set_defaults(run=_list)

    action("stats", "count your jobs by status and kind (all of them)").set_defaults(run=_stats)

    watching = action("watch", "follow a job's events until it ends; exit 0/1/3 = succeeded/failed/cancelled")
    watching.add_argument("job_id", metavar="ID")
    watching.add_argument("--after", type=int, default=0, metavar="N", help="only events after sequence N")
    watching.set_defaults(run=_watch)

    following = action("follow", "print your jobs' events as they commit (the feed), until interrupted")
    following.add_argument(
        "--kind", action="append", default=[], metavar="K", help="only jobs of this kind (repeatable)"
    )
    following.add_argument(
        "--type", action="append", default=[], metavar="T", help="only events of this type (repeatable)"
    )
    following.add_argument("--resource-type", default="", metavar="R", help="only jobs of this resource type")
    following.add_argument(
        "--after",
        default="",
        metavar="POS",
        help='resume after this position (the first column / "position")',
    )
    following.add_argument("--tail", action="store_true", help="start at the end: only events from now on")
    # The feed never ends by itself: Ctrl-C is how it is meant to end.
    following.set_defaults(run=follow, interrupted_status=0)

    cancel = action("cancel", "cancel a queued or running job")
    cancel.add_argument("job_id", metavar="ID")
    cancel.set_defaults(run=_cancel)

    retry = action("retry", "run a failed or cancelled job again, as a new job")
    retry.add_argument("job_id", metavar="ID")
    retry.set_defaults(run=_retry)


def job_row(job: jobs_pb2.Job) -> tuple[str, ...]:
    resource = f"{job.resource_type}/{job.resource_id}" if job.resource_id else ""
    attempt = f"{job.attempt}/{job.max_attempts}"
    return (
        job.id,
        job.kind,
        client_values.status_name(job.status),
        attempt,
        resource,
        when(job, "created_at"),
    )


def show_job(out: Output, job: jobs_pb2.Job) -> None:
    if out.json:
        out.message(job)
        return
    wait = jobs_pb2.WaitReason.Name(job.wait_reason).removeprefix("WAIT_REASON_").lower()
    out.fields(
        [
            ("id", job.id),
            ("kind", job.kind),
            ("status", client_values.status_name(job.status)),
            ("waiting", "" if job.wait_reason == jobs_pb2.WAIT_REASON_UNSPECIFIED else wait),
            ("attempt", f"{job.attempt} of {job.max_attempts}"),
            ("priority", str(job.priority or "")),
            ("resource", f"{job.resource_type}/{job.resource_id}" if job.resource_id else ""),
            ("run at", when(job, "run_at")),
            ("created", when(job, "created_at")),
            ("started", when(job, "started_at")),
            ("completed", when(job, "completed_at")),
            ("cancel requested", when(job, "cancel_requested_at")),
            ("error", job.error_message),
            ("error type", job.error_type),
            ("result", struct_text(job, "result")),
            ("retry of", job.retry_of_job_id),
            ("depends on", _dependencies_text(job)),
            ("on parent failure", _policy_name(job.on_parent_failure) if job.depends_on else ""),
        ]
    )


def _dependencies_text(job: jobs_pb2.Job) -> str:
    """How many parents it has, and how many it still waits for."""
    if not job.depends_on:
        return ""
    count = len(job.depends_on)
    jobs = "job" if count == 1 else "jobs"
    # A job cancelled while it waited keeps its count; only a queued one waits.
    if job.pending_dependencies and job.status == jobs_pb2.JOB_STATUS_QUEUED:
        return f"{count} {jobs}, waiting for {job.pending_dependencies}"
    return f"{count} {jobs}"


def _policy_name(policy: jobs_pb2.ParentFailurePolicy) -> str:
    if policy == jobs_pb2.PARENT_FAILURE_POLICY_UNSPECIFIED:
        return "cancel"
    return jobs_pb2.ParentFailurePolicy.Name(policy).removeprefix("PARENT_FAILURE_POLICY_").lower()


@dataclass(frozen=True)
class Relative:
    """A parent or child of the job shown: its id, and its status when the
    caller can still read it (None: a parent retention has since deleted)."""

    job_id: str
    status: jobs_pb2.JobStatus | None


async def _parents(client: Client, job: jobs_pb2.Job) -> list[Relative]:
    """Each parent's status, read with Get, in the order the job names them."""

    async def read(parent_id: str) -> Relative:
        try:
            return Relative(parent_id, (await client.get(parent_id)).status)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            return Relative(parent_id, None)

    return list(await asyncio.gather(*(read(parent_id) for parent_id in job.depends_on)))


def _relative_json(relative: Relative) -> dict[str, str]:
    if relative.status is None:
        return {"id": relative.job_id}
    return {"id": relative.job_id, "status": jobs_pb2.JobStatus.Name(relative.status)}


def _relative_row(relative: Relative) -> tuple[str, str]:
    status = "not found" if relative.status is None else client_values.status_name(relative.status)
    return relative.job_id, status


async def _enqueue(client: Client, args: argparse.Namespace, out: Output) -> int:
    resource_type, resource_id = client_values.resource(args.resource)
    response = await client.enqueue(
        args.kind,
        client_values.payload(args.payload),
        resource_type=resource_type,
        resource_id=resource_id,
        run_at=client_values.run_at(args.run_at),
        priority=args.priority or 0,
        depends_on=args.after,
        on_parent_failure=args.on_parent_failure,
    )
    if out.json:
        out.message(response)
    else:
        verb = "enqueued" if response.created else "already enqueued (same resource)"
        out.text(f"{verb}: {response.job.id}")
    if args.watch:
        return await watch(client, args, response.job.id, 0, out)
    return 0


async def _get(client: Client, args: argparse.Namespace, out: Output) -> int:
    """The job, then its parents (each read with Get) and its children (the
    first page of List's children filter): a graph is read from either end.
    In JSON the job's object gains `parents` and `children` (`{"id",
    "status"}` each; a parent that is gone has no status) and `moreChildren`."""
    job = await client.get(args.job_id)
    parents = await _parents(client, job)
    page = await client.list_page(depends_on=job.id, page_size=CHILDREN_SHOWN)
    children = [Relative(child.id, child.status) for child in page.jobs]
    more = bool(page.next_page_token)
    if out.json:
        out.line(
            {
                **to_dict(job),
                "parents": [_relative_json(parent) for parent in parents],
                "children": [_relative_json(child) for child in children],
                "moreChildren": more,
            }
        )
        return 0
    show_job(out, job)
    if parents:
        out.table(RELATIVE_COLUMNS, (_relative_row(parent) for parent in parents), title="parents")
    if children:
        out.table(RELATIVE_COLUMNS, (_relative_row(child) for child in children), title="children")
    if more:
        out.text(
            f"only the newest {len(children)} children are shown: "
            f"`leasehold jobs list --depends-on {job.id}` lists them all"
        )
    return 0


async def _stats(client: Client, args: argparse.Namespace, out: Output) -> int:
    stats = await client.stats()
    if out.json:
        out.message(stats)
        return 0
    rows = [_counts_row(kind.kind, kind.counts) for kind in stats.kinds]
    out.table(STATS_COLUMNS, [*rows, _counts_row("(all kinds)", stats.total)])
    if stats.kinds_truncated:
        out.text(f"only the first {len(stats.kinds)} kinds are listed; the last row counts every kind")
    return 0


def _counts_row(kind: str, counts: jobs_pb2.JobCounts) -> tuple[str, ...]:
    figures = (counts.queued, counts.running, counts.succeeded, counts.failed, counts.cancelled)
    return (kind, *(str(figure) for figure in figures))


async def _list(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit: at least 1")
    page_size = min(args.limit or MAX_PAGE, MAX_PAGE)
    found: list[jobs_pb2.Job] = []
    async for job in client.list(
        statuses=client_values.statuses(args.status),
        kind=args.kind,
        depends_on=args.depends_on,
        page_size=page_size,
    ):
        if out.json:
            out.message(job)
        found.append(job)
        if args.limit is not None and len(found) >= args.limit:
            break
    if not out.json:
        out.table(JOB_COLUMNS, (job_row(job) for job in found))
    return 0


async def _watch(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.after < 0:
        raise UsageError("--after: a sequence number, 0 or more")
    return await watch(client, args, args.job_id, args.after, out)


async def _cancel(client: Client, args: argparse.Namespace, out: Output) -> int:
    show_job(out, await client.cancel(args.job_id))
    return 0


async def _retry(client: Client, args: argparse.Namespace, out: Output) -> int:
    show_job(out, await client.retry(args.job_id))
    return 0

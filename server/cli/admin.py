"""`leasehold admin stats|workers|pause|resume|bulk-cancel|bulk-retry` (the admin role)."""

from __future__ import annotations

import argparse
from typing import Any

from leasehold._server.cli import client_values
from leasehold._server.cli.client_flags import common_flags
from leasehold._server.cli.output import Output, when
from leasehold.client import Client
from leasehold.v1 import admin_pb2

WORKER_COLUMNS = ("WORKER", "KINDS", "JOBS HELD", "LAST SEEN", "CLAIMING")
KIND_COLUMNS = ("KIND", "QUEUED", "RUNNING", "SUCCEEDED/H", "FAILED/H", "CANCELLED/H", "OLDEST DUE", "PAUSED")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    admin = commands.add_parser("admin", help="the queue across owners (admin role)")
    actions = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    common = common_flags()

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        return actions.add_parser(name, help=help_text, parents=[common], allow_abbrev=False)

    action("stats", "counts by kind and status, running per owner, the oldest queued job").set_defaults(
        run=_stats
    )
    action("workers", "remote workers: their kinds, jobs held and last heartbeat").set_defaults(run=_workers)
    for name, run, verb in (("pause", _pause, "stop claiming"), ("resume", _resume, "claim again")):
        parser = action(name, f"{verb} jobs of KIND on every replica")
        parser.add_argument("kind", metavar="KIND")
        parser.set_defaults(run=run)
    for name, run, what in (
        ("bulk-cancel", _bulk_cancel, "cancel every queued or running job"),
        ("bulk-retry", _bulk_retry, "retry every failed or cancelled job"),
    ):
        parser = action(name, f"{what} the filter matches")
        parser.add_argument(
            "--status", action="append", metavar="S", help="(repeatable; default: all it may)"
        )
        parser.add_argument("--kind", default="", metavar="K")
        parser.add_argument("--owner-id", default="", metavar="OWNER", help="only this owner's jobs")
        parser.add_argument("--resource", metavar="TYPE/ID")
        parser.add_argument("--dry-run", action="store_true", help="only count what would be touched")
        parser.add_argument(
            "--all",
            action="store_true",
            dest="confirm_all",
            help="confirm acting on every owner's jobs when no --kind, --owner-id or --resource narrows it",
        )
        parser.set_defaults(run=run)


async def _stats(client: Client, args: argparse.Namespace, out: Output) -> int:
    stats = await client.admin.get_queue_stats()
    if out.json:
        out.message(stats)
        return 0
    out.table(KIND_COLUMNS, (_kind_row(kind) for kind in stats.kinds), title="Kinds")
    if stats.running_by_owner:
        owners = ((owner.owner_id, str(owner.running)) for owner in stats.running_by_owner)
        out.table(("OWNER", "RUNNING"), owners, title="Running by owner")
    else:
        out.text("running: none")
    oldest = stats.oldest_queued_job_id
    due = when(stats, "oldest_queued_due_at")
    out.text(f"oldest due job: {oldest} (due since {due})" if oldest else "oldest due job: none is due")
    if stats.truncated:
        out.text(
            f"truncated: only the {len(stats.kinds)} busiest kinds and the {len(stats.running_by_owner)} "
            "owners with the most running jobs are listed"
        )
    return 0


async def _workers(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = await client.admin.workers()
    if out.json:
        out.message(found)
        return 0
    if not found.workers:
        out.text("no remote worker is known")
        return 0
    out.table(WORKER_COLUMNS, (_worker_row(worker) for worker in found.workers))
    if found.truncated:
        out.text(f"only the first {len(found.workers)} workers are listed")
    return 0


def _worker_row(worker: admin_pb2.RemoteWorker) -> tuple[str, ...]:
    claiming = "yes" if worker.claiming else ""
    kinds = ",".join(worker.kinds)
    return (worker.worker_id, kinds, str(worker.jobs_held), when(worker, "last_seen_at"), claiming)


def _kind_row(kind: admin_pb2.KindStats) -> tuple[str, ...]:
    counts = (
        kind.queued,
        kind.running,
        kind.succeeded_last_hour,
        kind.failed_last_hour,
        kind.cancelled_last_hour,
    )
    paused = "yes" if kind.paused else ""
    return (kind.kind, *(str(count) for count in counts), when(kind, "oldest_queued_due_at"), paused)


async def _pause(client: Client, args: argparse.Namespace, out: Output) -> int:
    await client.admin.pause_kind(args.kind)
    return _kind_state(out, args.kind, paused=True)


async def _resume(client: Client, args: argparse.Namespace, out: Output) -> int:
    await client.admin.resume_kind(args.kind)
    return _kind_state(out, args.kind, paused=False)


def _kind_state(out: Output, kind: str, *, paused: bool) -> int:
    if out.json:
        out.message(admin_pb2.PauseKindResponse(kind=kind, paused=paused))
    else:
        out.text(f"{kind}: {'paused' if paused else 'resumed'}")
    return 0


def _filter(args: argparse.Namespace) -> dict[str, Any]:
    resource_type, resource_id = client_values.resource(args.resource)
    return dict(
        statuses=client_values.statuses(args.status),
        kind=args.kind,
        owner_id=args.owner_id,
        resource_type=resource_type,
        resource_id=resource_id,
        dry_run=args.dry_run,
        confirm_all=args.confirm_all,
    )


async def _bulk_cancel(client: Client, args: argparse.Namespace, out: Output) -> int:
    matched = await client.admin.bulk_cancel(**_filter(args))
    return _bulk(
        out, admin_pb2.BulkCancelResponse(matched=matched, dry_run=args.dry_run), "cancel", "cancelled"
    )


async def _bulk_retry(client: Client, args: argparse.Namespace, out: Output) -> int:
    matched = await client.admin.bulk_retry(**_filter(args))
    return _bulk(out, admin_pb2.BulkRetryResponse(matched=matched, dry_run=args.dry_run), "retry", "retried")


def _bulk(
    out: Output, response: admin_pb2.BulkCancelResponse | admin_pb2.BulkRetryResponse, verb: str, done: str
) -> int:
    if out.json:
        out.message(response)
    elif response.dry_run:
        out.text(f"would {verb} {response.matched} jobs (dry run: nothing changed)")
    else:
        out.text(f"{done} {response.matched} jobs")
    return 0

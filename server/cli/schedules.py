"""`leasehold schedules create|get|list|pause|resume|delete|trigger`."""

from __future__ import annotations

import argparse

from leasehold._server.cli import client_values
from leasehold._server.cli.client_flags import UsageError, common_flags
from leasehold._server.cli.output import Output, when
from leasehold.client import Client
from leasehold.v1 import schedules_pb2

COLUMNS = ("ID", "CRON", "ZONE", "KIND", "PAUSED", "NEXT FIRE", "LAST FIRE", "LAST JOB")
OVERLAPS = {"skip": schedules_pb2.OVERLAP_POLICY_SKIP, "allow": schedules_pb2.OVERLAP_POLICY_ALLOW}


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schedules = commands.add_parser("schedules", help="recurring jobs on a cron rule")
    actions = schedules.add_subparsers(dest="schedules_command", required=True, metavar="COMMAND")
    common = common_flags()

    def action(name: str, help_text: str, run: object, with_id: bool = True) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, help=help_text, parents=[common], allow_abbrev=False)
        if with_id:
            parser.add_argument("schedule_id", metavar="ID")
        parser.set_defaults(run=run)
        return parser

    create = action("create", "create a schedule ID that enqueues KIND on a cron rule", _create)
    create.add_argument("--cron", required=True, metavar="EXPR", help="five fields, e.g. '0 3 * * *'")
    create.add_argument("--kind", required=True, metavar="KIND", help="the job each firing enqueues")
    create.add_argument("--payload", metavar="JSON|@FILE", help="the job's input: a JSON object")
    create.add_argument("--time-zone", default="", metavar="ZONE", help="IANA name (default UTC)")
    create.add_argument("--priority", type=int, default=0, metavar="N", help="1 (first) to 5; default 3")
    create.add_argument("--overlap", choices=sorted(OVERLAPS), help="while the last firing's job runs (skip)")
    create.add_argument("--catchup-window", type=int, default=0, metavar="SECONDS")
    create.add_argument("--paused", action="store_true", help="create it paused")
    action("get", "show one schedule", _get)
    action("list", "list your schedules", _list, with_id=False)
    action("pause", "stop firing until resumed", _pause)
    action("resume", "fire again", _resume)
    action("delete", "delete the schedule (its jobs stay)", _delete)
    action("trigger", "fire once now", _trigger)


def _row(schedule: schedules_pb2.Schedule) -> tuple[str, ...]:
    return (
        schedule.schedule_id,
        schedule.cron,
        schedule.time_zone,
        schedule.job.kind,
        "yes" if schedule.paused else "no",
        when(schedule, "next_fire_at"),
        when(schedule, "last_fire_at"),
        schedule.last_job_id,
    )


def _show(out: Output, schedule: schedules_pb2.Schedule) -> None:
    if out.json:
        out.message(schedule)
    else:
        out.table(COLUMNS, [_row(schedule)])


async def _create(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.catchup_window < 0:
        raise UsageError("--catchup-window: 0 or more seconds")
    schedule = await client.create_schedule(
        args.schedule_id,
        args.cron,
        args.kind,
        client_values.payload(args.payload),
        time_zone=args.time_zone,
        priority=args.priority,
        overlap=OVERLAPS[args.overlap] if args.overlap else schedules_pb2.OVERLAP_POLICY_UNSPECIFIED,
        catchup_window_seconds=args.catchup_window,
        paused=args.paused,
    )
    _show(out, schedule)
    return 0


async def _get(client: Client, args: argparse.Namespace, out: Output) -> int:
    _show(out, await client.get_schedule(args.schedule_id))
    return 0


async def _list(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = []
    async for schedule in client.list_schedules():
        if out.json:
            out.message(schedule)
        found.append(schedule)
    if not out.json:
        out.table(COLUMNS, (_row(schedule) for schedule in found))
    return 0


async def _pause(client: Client, args: argparse.Namespace, out: Output) -> int:
    _show(out, await client.pause_schedule(args.schedule_id))
    return 0


async def _resume(client: Client, args: argparse.Namespace, out: Output) -> int:
    _show(out, await client.resume_schedule(args.schedule_id))
    return 0


async def _delete(client: Client, args: argparse.Namespace, out: Output) -> int:
    await client.delete_schedule(args.schedule_id)
    if out.json:
        out.line({"scheduleId": args.schedule_id, "deleted": True})
    else:
        out.text(f"deleted: {args.schedule_id}")
    return 0


async def _trigger(client: Client, args: argparse.Namespace, out: Output) -> int:
    response = await client.trigger_schedule(args.schedule_id)
    if out.json:
        out.message(response)
    else:
        out.text(f"triggered: {args.schedule_id} enqueued {response.job.id}")
    return 0

"""`jobs follow`: the owner's feed (`Client.subscribe`) as it comes, one line an
event, until interrupted.

It is the terminal's view of what a backend consumes in code, so each line carries
the position to store and resume from. It rides through a restart of the service
as `jobs watch` does (the client resumes after the last position printed, and the
one line it logs when events flow again is shown on stderr); a feed never ends by
itself, so Ctrl-C is its normal end and exits 0.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

import grpc

from leasehold._server.cli import client_flags
from leasehold._server.cli.client_flags import UsageError
from leasehold._server.cli.output import Output, struct_text, when
from leasehold._server.cli.watch import GAVE_UP, WatchUnreachable, reconnect_notices
from leasehold.client import Client, to_dict
from leasehold.v1 import jobs_pb2


async def follow(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.after and args.tail:
        raise UsageError("after: --after and --tail go apart (--tail starts at the end of the feed)")
    last = args.after
    try:
        with reconnect_notices():
            async for response in client.subscribe(
                after_position=args.after,
                kinds=args.kind,
                resource_type=args.resource_type,
                event_types=args.type,
                tail=args.tail,
                deadline_seconds=client_flags.watch_deadline(args),
            ):
                _show(out, response)
                last = response.position
    except grpc.aio.AioRpcError as error:
        if error.code() not in GAVE_UP or not last:
            raise  # nothing was printed to resume after: the call's own error says it all
        raise WatchUnreachable(
            f"{error.code().name}: no answer from {client_flags.server(args)} within --wait "
            f"{client_flags.wait_seconds(args):g} s while following the feed; "
            f"`{_resume_command(args, last)}` resumes it"
        ) from None
    raise AssertionError("unreachable: the feed never ends by itself")


def _show(out: Output, response: jobs_pb2.SubscribeResponse) -> None:
    if out.json:
        out.line(feed_json(response))
        return
    event = response.event
    fields = (
        response.position,
        when(event, "created_at"),
        event.job_id,
        response.kind,
        event.type,
        struct_text(event, "payload"),
    )
    # print, not rich: an event's payload is data, never markup or :emoji: codes.
    print(" ".join(fields).rstrip(), flush=True)


def feed_json(response: jobs_pb2.SubscribeResponse) -> dict[str, Any]:
    """One flat object a line, named as the proto's fields are: a consumer reads
    `position` next to the event without reaching into a nested message."""
    event = response.event
    return {
        "position": response.position,
        "job_id": event.job_id,
        "sequence": event.sequence,
        "type": event.type,
        "payload": to_dict(event.payload),
        "created_at": event.created_at.ToJsonString() if event.HasField("created_at") else "",
        "kind": response.kind,
        "resource_type": response.resource_type,
        "resource_id": response.resource_id,
    }


def _resume_command(args: argparse.Namespace, last: str) -> str:
    words = ["leasehold", "jobs", "follow"]
    words += [word for kind in args.kind for word in ("--kind", kind)]
    words += [word for event_type in args.type for word in ("--type", event_type)]
    if args.resource_type:
        words += ["--resource-type", args.resource_type]
    return shlex.join([*words, "--after", last])

"""Runs one client command (`leasehold jobs`, `leasehold schedules` and `leasehold
admin`: the service's calls from a terminal, built on `leasehold.client`) and turns
every way it can end into an exit status and, for an error, one line on stderr.

Exit statuses (docs/cli.md): 0 done; 1 a watched job failed; 3 a watched
job was cancelled; 2 a usage mistake (a bad flag or value, before any call);
4 the service refused the call (its status code and message are printed);
5 the service could not be reached (UNAVAILABLE or DEADLINE_EXCEEDED after the
client's retries). Every error is one line on stderr, never a traceback.
Ctrl-C exits 130, except for a command that ends only when interrupted (`jobs
follow` sets `interrupted_status`), for which it is the normal end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

import grpc

from leasehold._server.cli.client_flags import UsageError, client, output_mode
from leasehold._server.cli.output import Output
from leasehold._server.cli.watch import WatchUnreachable
from leasehold.client import Client

EXIT_USAGE = 2
EXIT_REFUSED = 4
EXIT_UNREACHABLE = 5
EXIT_INTERRUPTED = 130
UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

Command = Callable[[Client, argparse.Namespace, Output], Awaitable[int]]


def run(args: argparse.Namespace) -> int:
    try:
        out = Output(output_mode(args))
        return asyncio.run(_call(args.run, args, out))
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except WatchUnreachable as exc:
        return _fail(str(exc), EXIT_UNREACHABLE)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        status = EXIT_UNREACHABLE if code in UNREACHABLE else EXIT_REFUSED
        return _fail(f"{code.name}: {exc.details() or 'no details'}", status)
    except KeyboardInterrupt:
        interrupted: int = getattr(args, "interrupted_status", EXIT_INTERRUPTED)
        return interrupted


async def _call(command: Command, args: argparse.Namespace, out: Output) -> int:
    async with client(args) as connection:
        return await command(connection, args, out)


def _fail(message: str, status: int) -> int:
    print(f"leasehold: {message}", file=sys.stderr)
    return status

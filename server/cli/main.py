"""The `leasehold` command's parser, and the dispatch to the command given.

Every flag can also come from the environment as LEASEHOLD_<FLAG> (dashes become
underscores); a flag on the command line wins. Configuration mistakes end with one
line naming the setting and exit status 2, never a traceback.

The parser is built from modules that declare flags and import nothing heavy
(serve_flags.py, worker_flags.py, the client commands'); a command's own module,
and with it the stack that command runs on, is imported only when it runs, so
`leasehold jobs get` never loads SQLAlchemy, the runtime or the dashboard.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import leasehold
from leasehold._server.cli import admin, jobs, schedules, serve_flags, token, worker_flags
from leasehold._server.conformance import command as conformance_command

DESCRIPTION = """Leasehold: durable background jobs over gRPC. `leasehold serve` runs the service,
`leasehold worker` runs handlers for its remote kinds, `leasehold worker-conformance` checks
a worker in any language, and `leasehold jobs|schedules|admin` talk to a running server.
Every flag can also come from the environment as LEASEHOLD_<FLAG> (dashes become
underscores); a flag on the command line wins.
Run `leasehold COMMAND --help` for a command's flags."""


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="leasehold", description=DESCRIPTION)
    # Prints "leasehold <version>" to stdout and exits 0, before any command is required.
    top.add_argument("--version", action="version", version=f"%(prog)s {leasehold.__version__}")
    commands = top.add_subparsers(dest="command", required=True)
    serve_flags.add_parsers(commands)
    worker_flags.add_parser(commands)
    conformance_command.add_parser(commands)
    token.add_parser(commands)
    jobs.add_parser(commands)
    schedules.add_parser(commands)
    admin.add_parser(commands)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if args.command == "serve":
        from leasehold._server.cli import serve

        return serve.main(args, argv)
    if args.command == "migrate":
        from leasehold._server.cli import migrate

        return migrate.main(args)
    if args.command == "worker":
        from leasehold._server.cli import worker

        return worker.main(args)
    if args.command == "worker-conformance":
        return conformance_command.main(args)
    if args.command == "token":
        return token.main(args)
    from leasehold._server.cli import client_runner

    return client_runner.run(args)

"""`leasehold jobs`, `leasehold schedules` and `leasehold admin`: the service's calls
from a terminal, built on `leasehold.client`.

Exit statuses (README: Command line): 0 done; 1 a watched job failed; 3 a watched
job was cancelled; 2 a usage mistake (a bad flag or value, before any call);
4 the service refused the call (its status code and message are printed);
5 the service could not be reached (UNAVAILABLE or DEADLINE_EXCEEDED after the
client's retries). Every error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse

from leasehold._server.client_cli import admin, jobs, schedules
from leasehold._server.client_cli.runner import run

COMMANDS = frozenset({"jobs", "schedules", "admin"})


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs.add_parser(commands)
    schedules.add_parser(commands)
    admin.add_parser(commands)


def main(args: argparse.Namespace) -> int:
    return run(args)

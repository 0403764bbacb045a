"""`leasehold token create ROLE`: mint a token for `serve --auth token`.

Prints the token (line 1, shown this once: the server keeps only its hash) and
the line to add to the token file (line 2); then `kill -HUP` the server.
"""

from __future__ import annotations

import argparse
import sys

from leasehold._server.auth.identity import ROLE_SYNTAX
from leasehold._server.auth.tokens import new_token

EXIT_CONFIG = 2


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = commands.add_parser("token", help="mint tokens for serve --auth token")
    actions = token.add_subparsers(dest="token_command", required=True)
    create = actions.add_parser("create", help="print a new token and its token-file line")
    create.add_argument("role", metavar="ROLE", help=ROLE_SYNTAX)


def main(args: argparse.Namespace) -> int:
    try:
        token, line = new_token(args.role)
    except ValueError as exc:
        print(f"leasehold: role: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(token)
    print(line)
    print(
        "leasehold: add the second line to the --token-file, then send the server SIGHUP; "
        "the token is not shown again",
        file=sys.stderr,
    )
    return 0

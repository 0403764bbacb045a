"""`leasehold worker`'s flags (worker.py reads them): declared apart from it, so
that every command's parser is built without importing the remote worker and
the handlers' runtime."""

from __future__ import annotations

import argparse

from leasehold._server.defaults import DEFAULT_CONCURRENCY
from leasehold._server.logs import redact_flag


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `worker` subcommand's flags, on the top-level subparsers."""
    worker = commands.add_parser("worker", help="run handler modules for a server's remote kinds")
    worker.add_argument("--server", help="HOST:PORT of the leasehold server")
    worker.add_argument("--handlers", nargs="+", metavar="MODULE", help="modules defining register(registry)")
    worker.add_argument("--concurrency", help=f"jobs run at once (default {DEFAULT_CONCURRENCY})")
    worker.add_argument(
        "--kinds", nargs="+", metavar="KIND", help="kinds to claim (default: every registered kind)"
    )
    worker.add_argument("--worker-id", help="names this worker in leases and logs (default host:pid:random)")
    worker.add_argument("--log-level", help="debug, info, warning or error (default info)")
    redact_flag(worker)
    worker.add_argument(
        "--tls-ca", metavar="FILE", help="connect over TLS, trusting this CA's PEM certificate(s)"
    )
    worker.add_argument(
        "--tls-client-cert", metavar="FILE", help="the client certificate (serve --auth mtls)"
    )
    worker.add_argument("--tls-client-key", metavar="FILE", help="the client certificate's private key")

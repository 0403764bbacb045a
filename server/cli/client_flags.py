"""The flags every client command shares, each also read from LEASEHOLD_<FLAG>
(a flag on the command line wins), and the `Client` they describe."""

from __future__ import annotations

import argparse
from pathlib import Path

from leasehold._server.defaults import DEFAULT_LISTEN, env
from leasehold.client import Client, RetryOptions, Tls

OUTPUTS = ("table", "json")
# How long a command keeps trying a service that does not answer before it gives
# up with exit status 5. A watch that has reached the service waits out a restart
# however long it takes, unless --wait is given (watch_deadline).
DEFAULT_WAIT_SECONDS = 15.0


class UsageError(Exception):
    """A flag or value is wrong; the message names it. Exit status 2."""


def common_flags() -> argparse.ArgumentParser:
    """A parent parser: its flags go on every leaf command, so they may follow it."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("connection and output (each also LEASEHOLD_<FLAG>)")
    group.add_argument("--server", metavar="HOST:PORT", help=f"the service (default {DEFAULT_LISTEN})")
    group.add_argument("--owner", help="call as this owner (x-owner-id; serve --auth header)")
    group.add_argument("--token", help="bearer token (serve --auth token or jwt); prefer LEASEHOLD_TOKEN")
    group.add_argument(
        "--tls", action="store_true", default=None, help="connect over TLS, trusting the system's roots"
    )
    group.add_argument(
        "--tls-ca", metavar="FILE", help="connect over TLS, trusting this CA's PEM certificate(s)"
    )
    group.add_argument("--tls-client-cert", metavar="FILE", help="the client certificate (serve --auth mtls)")
    group.add_argument("--tls-client-key", metavar="FILE", help="the client certificate's private key")
    group.add_argument("--output", "-o", help="table (default) or json: one object per line")
    group.add_argument(
        "--wait",
        metavar="SECONDS",
        help=f"keep retrying an unreachable service this long (default {DEFAULT_WAIT_SECONDS:g}; "
        "a watch rides through a restart unless this is given)",
    )
    return parser


def _setting(args: argparse.Namespace, name: str) -> str | None:
    value = getattr(args, name, None)
    if value is not None:
        return "1" if value is True else str(value)
    return env(name.upper())


def output_mode(args: argparse.Namespace) -> str:
    mode = (_setting(args, "output") or "table").lower()
    if mode not in OUTPUTS:
        raise UsageError(f"output: one of {', '.join(OUTPUTS)}, not {mode!r}")
    return mode


def _read(flag: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc.strerror}") from None


def _tls(args: argparse.Namespace) -> Tls | None:
    ca, cert, key = (_setting(args, name) for name in ("tls_ca", "tls_client_cert", "tls_client_key"))
    if bool(cert) != bool(key):
        raise UsageError("tls_client_cert: --tls-client-cert and --tls-client-key go together")
    wanted = _setting(args, "tls") not in (None, "0", "false", "no")
    if not (wanted or ca or cert):
        return None
    return Tls(
        root_certificates=_read("--tls-ca", ca),
        certificate_chain=_read("--tls-client-cert", cert),
        private_key=_read("--tls-client-key", key),
    )


def server(args: argparse.Namespace) -> str:
    return _setting(args, "server") or DEFAULT_LISTEN


def client(args: argparse.Namespace) -> Client:
    return Client(
        server(args),
        owner=_setting(args, "owner"),
        token=_setting(args, "token"),
        tls=_tls(args),
        retry=RetryOptions(deadline_seconds=wait_seconds(args)),
    )


def watch_deadline(args: argparse.Namespace) -> float | None:
    """How long a watch that has reached the service keeps reconnecting after a
    break: --wait (or LEASEHOLD_WAIT) when given, otherwise as long as the job
    runs. The default --wait is for a service that is not there; a restarting one
    is away for its drain, which may take longer, and then comes back."""
    return None if _setting(args, "wait") is None else wait_seconds(args)


def wait_seconds(args: argparse.Namespace) -> float:
    text = _setting(args, "wait")
    if text is None:
        return DEFAULT_WAIT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1
    if not 0 <= seconds <= 3600:
        raise UsageError(f"wait: seconds from 0 to 3600, not {text!r}")
    return seconds

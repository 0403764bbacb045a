"""`serve`'s identity, TLS and call-limit flags (DESIGN §13), kept apart from
serve_flags.py so that file only adds them. As every flag, each can also come from the
environment as LEASEHOLD_<FLAG>; a flag on the command line wins."""

from __future__ import annotations

import argparse
from typing import Any

from leasehold._server.api.call_gate import DEFAULT_MAX_CALLS_PER_OWNER
from leasehold._server.auth.jwt_auth import DEFAULT_OWNER_CLAIM, DEFAULT_ROLE_CLAIM
from leasehold._server.auth.settings import MODES, AuthSettings
from leasehold._server.defaults import env, env_true

_FILES = ("token_file", "jwt_key_file", "tls_cert", "tls_key", "tls_client_ca")


def add_arguments(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("identity and TLS (docs/security.md)")
    group.add_argument("--auth", help=f"who callers are: {', '.join(MODES)} (default header)")
    group.add_argument("--token-file", metavar="FILE", help="--auth token: 'sha256:<hex> ROLE' lines")
    group.add_argument(
        "--jwt-key-file", metavar="FILE", help="--auth jwt: an HS256 secret, PEM public keys, or a JWKS"
    )
    group.add_argument("--jwt-issuer", help="--auth jwt: the required iss")
    group.add_argument("--jwt-audience", help="--auth jwt: the required aud")
    group.add_argument(
        "--jwt-owner-claim", help=f"--auth jwt: the owner id's claim (default {DEFAULT_OWNER_CLAIM})"
    )
    group.add_argument(
        "--jwt-role-claim",
        help=f"--auth jwt: the role's claim (default {DEFAULT_ROLE_CLAIM}; absent means owner)",
    )
    group.add_argument("--tls-cert", metavar="FILE", help="the server's PEM certificate (chain)")
    group.add_argument("--tls-key", metavar="FILE", help="the server's PEM private key")
    group.add_argument(
        "--tls-client-ca", metavar="FILE", help="--auth mtls: the CA(s) client certificates must chain to"
    )
    group.add_argument(
        "--allow-insecure-header-auth",
        action="store_true",
        default=None,
        help="let --auth header listen beyond loopback without TLS (only behind an authenticating gateway)",
    )
    group.add_argument(
        "--max-calls-per-owner",
        help=f"unary calls one owner may have in flight at once (default {DEFAULT_MAX_CALLS_PER_OWNER})",
    )


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """`Settings` keyword arguments. Raises ValueError naming the flag."""
    allow = bool(args.allow_insecure_header_auth) or env_true("ALLOW_INSECURE_HEADER_AUTH")
    auth = AuthSettings(
        mode=_value(args, "auth") or "header",
        **{name: _value(args, name) for name in _FILES},
        jwt_issuer=_value(args, "jwt_issuer"),
        jwt_audience=_value(args, "jwt_audience"),
        jwt_owner_claim=_value(args, "jwt_owner_claim") or DEFAULT_OWNER_CLAIM,
        jwt_role_claim=_value(args, "jwt_role_claim") or DEFAULT_ROLE_CLAIM,
        allow_insecure_header_auth=allow,
    )
    text = _value(args, "max_calls_per_owner")
    try:
        calls = DEFAULT_MAX_CALLS_PER_OWNER if text is None else int(text)
    except ValueError:
        raise ValueError(
            f"{_source(args, 'max_calls_per_owner')}: expected an integer, got {text!r}"
        ) from None
    return {"auth": auth, "max_calls_per_owner": calls}


def _value(args: argparse.Namespace, name: str) -> str | None:
    value = getattr(args, name)
    return str(value) if value is not None else env(name.upper())


def _source(args: argparse.Namespace, name: str) -> str:
    return f"--{name.replace('_', '-')}" if getattr(args, name) is not None else f"LEASEHOLD_{name.upper()}"

"""`--auth token`: bearer tokens whose SHA-256 hashes and roles are listed in a
file, one `sha256:<hex> ROLE` a line, re-read on SIGHUP.

The file holds no token, only hashes, so it can be read by whoever deploys the
server without handing out credentials. A presented token is hashed and looked
up: the lookup's timing depends on the hash, never on how much of a guess was
right, which is what a constant-time comparison is for. Errors name the file
and line, never a field's text: a token pasted by mistake must not reach a log.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

import grpc
import structlog

from leasehold._server.auth.authenticator import bearer
from leasehold._server.auth.identity import ROLE_SYNTAX, Identity, Role, parse_role, refusal

log = structlog.get_logger("leasehold.auth")

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
TOKEN_PREFIX = "lh_"


class TokenFileError(ValueError):
    """The token file cannot be used; the message names it and the line."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(role: str) -> tuple[str, str]:
    """A fresh random token for `role`, and the token-file line that grants it.
    Raises ValueError for a role that is not one."""
    parse_role(role)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, f"sha256:{digest(token)} {role}"


def load_token_file(path: str) -> dict[str, Identity]:
    """Each listed hash (hex) and the identity it grants."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"token_file: cannot read {path}: {type(exc).__name__}") from None
    tokens: dict[str, Identity] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"token_file: {path}, line {number}"
        match = _DIGEST.fullmatch(words[0])
        if match is None or len(words) != 2:
            raise TokenFileError(f"{where}: expected 'sha256:<64 lowercase hex digits> ROLE'")
        try:
            identity = parse_role(words[1])
        except ValueError:
            raise TokenFileError(f"{where}: ROLE must be {ROLE_SYNTAX}") from None
        if match.group(1) in tokens:
            raise TokenFileError(f"{where}: the same hash is listed twice")
        tokens[match.group(1)] = identity
    return tokens


class TokenAuthenticator:
    def __init__(self, path: str) -> None:
        self._path = path
        self._tokens = load_token_file(path)

    def authenticate(self, context: grpc.aio.ServicerContext, wanted: Role) -> Identity:
        token = bearer(context.invocation_metadata() or ())
        if token is None:
            raise refusal(wanted, "missing authorization: Bearer <token> metadata")
        identity = self._tokens.get(digest(token))
        if identity is None:
            raise refusal(wanted, "the bearer token is not valid")
        return identity

    def reload(self) -> None:
        try:
            tokens = load_token_file(self._path)
        except TokenFileError as exc:
            log.error("auth.token_file_reload_failed", error=str(exc), kept=len(self._tokens))
            return
        self._tokens = tokens
        log.info("auth.token_file_reloaded", tokens=len(tokens))

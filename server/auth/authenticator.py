"""The seam: one `Authenticator` per server turns a call into an Identity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from leasehold._server.auth.identity import Identity, Role

Metadata = Sequence[tuple[str, str | bytes]]

AUTHORIZATION_HEADER = "authorization"
_BEARER = "bearer "


class Authenticator(Protocol):
    def authenticate(self, context: grpc.aio.ServicerContext, wanted: Role) -> Identity:
        """The caller's identity, or an `Unauthenticated` refusal made with
        `refusal(wanted, ...)`. `wanted` (the role the service needs) only
        chooses the words and reason of a refusal; the role check is the
        gate's."""
        ...

    def reload(self) -> None:
        """Re-read credentials from disk (SIGHUP); keep the old ones if the new
        ones are bad."""
        ...


def bearer(metadata: Metadata) -> str | None:
    """The token of the one `authorization: Bearer <token>` entry, if there is one."""
    values = [value for key, value in metadata if key.lower() == AUTHORIZATION_HEADER]
    if len(values) != 1 or isinstance(values[0], bytes):
        return None
    value = values[0]
    if value[: len(_BEARER)].lower() != _BEARER:
        return None
    return value[len(_BEARER) :].strip() or None

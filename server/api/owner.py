"""The `x-owner-id` header of `--auth header` (server/auth/header.py).

The header is trusted, which is right for local use or behind a gateway that
has already authenticated the caller; the other auth modes take the owner from
a credential instead.
"""

from __future__ import annotations

from leasehold._server.auth.authenticator import Metadata
from leasehold._server.auth.identity import OWNER_PATTERN, OwnerUnresolved

__all__ = [
    "OWNER_HEADER",
    "OWNER_PATTERN",
    "HeaderOwnerResolver",
    "Metadata",
    "OwnerUnresolved",
]

OWNER_HEADER = "x-owner-id"


class HeaderOwnerResolver:
    def __init__(self, header: str = OWNER_HEADER) -> None:
        self._header = header

    def resolve(self, metadata: Metadata) -> str:
        values = [value for key, value in metadata if key.lower() == self._header]
        if not values:
            raise OwnerUnresolved(f"missing {self._header} header")
        if len(values) > 1:
            raise OwnerUnresolved(f"{self._header} must be sent exactly once")
        value = values[0]
        if isinstance(value, bytes) or OWNER_PATTERN.fullmatch(value) is None:
            raise OwnerUnresolved(f"{self._header} must be 1-128 characters of [A-Za-z0-9._:@-]")
        return value

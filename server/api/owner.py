"""Who is calling. One seam: the servicer asks an `OwnerResolver` and nothing else.

The default trusts the `x-owner-id` header, which is right for local use or behind
a gateway that has already authenticated the caller. Bearer tokens, JWT or mTLS
plug in as other resolvers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

OWNER_HEADER = "x-owner-id"
OWNER_PATTERN = re.compile(r"[A-Za-z0-9._:@-]{1,128}")

Metadata = Sequence[tuple[str, str | bytes]]


class OwnerUnresolved(Exception):
    """The call carries no usable owner identity."""


class OwnerResolver(Protocol):
    def resolve(self, metadata: Metadata) -> str: ...


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

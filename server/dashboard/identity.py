"""Who a signed-in credential is, for the header's "Signed in as …".

The API answers what a credential may do (the sign-in probe asks JobService
and AdminService), but no RPC names the owner a bearer token stands for. The
process's own authenticator knows: this asks it to resolve the credential
exactly as the call gate would, and uses the answer only to name the user.
Nothing is read or done on the strength of it; every page still acts through
the API with the credential itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import grpc

from leasehold._server.auth.authenticator import Authenticator
from leasehold._server.auth.identity import Role, Unauthenticated
from leasehold._server.dashboard.sessions import Credential

# The owner id a credential stands for; None when it names no owner.
OwnerOf = Callable[[Credential], str | None]


class _Presented:
    """The two things an authenticator reads of a call: its metadata and
    (for mTLS) the peer's certificate, which a stored credential has none of."""

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def owner_resolver(authenticator: Authenticator) -> OwnerOf:
    """An OwnerOf backed by `authenticator` (reloaded on SIGHUP with it)."""

    def owner_of(credential: Credential) -> str | None:
        if credential.kind == "owner":  # --auth header: the id is the credential
            return credential.value
        presented = _Presented((("authorization", f"Bearer {credential.value}"),))
        try:
            identity = authenticator.authenticate(cast(grpc.aio.ServicerContext, presented), Role.OWNER)
        except Unauthenticated:
            return None
        return identity.owner_id

    return owner_of

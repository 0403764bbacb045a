"""The worker role of `--auth header`: the holder of the one worker token.

In header mode workers share one bearer token, `LEASEHOLD_WORKER_TOKEN`,
configured on the server and on every worker (the other modes give each worker
its own credential, server/auth/). A worker credential is never an owner:
JobService refuses a call that carries it, so a leaked worker token cannot read
or steer anyone's jobs.
"""

from __future__ import annotations

import hmac

from leasehold._server.auth.authenticator import AUTHORIZATION_HEADER, Metadata, bearer
from leasehold._server.auth.identity import WorkerUnauthenticated

__all__ = ["TOKEN_SETTING", "WorkerAuth", "WorkerUnauthenticated"]

TOKEN_SETTING = "LEASEHOLD_WORKER_TOKEN"


class WorkerAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    def check(self, metadata: Metadata) -> None:
        """Raises WorkerUnauthenticated unless the call carries the worker token."""
        if self._token is None:
            raise WorkerUnauthenticated(
                f"WorkerService is disabled: start the server with {TOKEN_SETTING} set"
            )
        presented = bearer(metadata)
        if presented is None:
            raise WorkerUnauthenticated(f"missing {AUTHORIZATION_HEADER}: Bearer <worker token> metadata")
        # Constant time: how much of a guess was right must not show in how long
        # the answer takes.
        if not hmac.compare_digest(presented.encode(), self._token):
            raise WorkerUnauthenticated("the worker token is not valid")

    def is_worker_credential(self, metadata: Metadata) -> bool:
        """Whether the call presents the worker token (which JobService refuses)."""
        presented = bearer(metadata)
        return (
            self._token is not None
            and presented is not None
            and hmac.compare_digest(presented.encode(), self._token)
        )

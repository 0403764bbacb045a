"""Who may call WorkerService: the holder of the one worker token (DESIGN §10).

Until the auth modes of DESIGN §13 exist, workers share one bearer token,
`LEASEHOLD_WORKER_TOKEN`, configured on the server and on every worker. A
worker credential is never an owner: JobService refuses a call that carries it,
so a leaked worker token cannot read or steer anyone's jobs.
"""

from __future__ import annotations

import hmac

from leasehold._server.api.owner import Metadata

AUTHORIZATION_HEADER = "authorization"
BEARER = "bearer "
TOKEN_SETTING = "LEASEHOLD_WORKER_TOKEN"


class WorkerUnauthenticated(Exception):
    """The call does not carry the worker token (or none is configured)."""


class WorkerAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    def check(self, metadata: Metadata) -> None:
        """Raises WorkerUnauthenticated unless the call carries the worker token."""
        if self._token is None:
            raise WorkerUnauthenticated(
                f"WorkerService is disabled: start the server with {TOKEN_SETTING} set"
            )
        presented = _bearer(metadata)
        if presented is None:
            raise WorkerUnauthenticated(f"missing {AUTHORIZATION_HEADER}: Bearer <worker token> metadata")
        # Constant time: how much of a guess was right must not show in how long
        # the answer takes.
        if not hmac.compare_digest(presented.encode(), self._token):
            raise WorkerUnauthenticated("the worker token is not valid")

    def is_worker_credential(self, metadata: Metadata) -> bool:
        """Whether the call presents the worker token (which JobService refuses)."""
        presented = _bearer(metadata)
        return (
            self._token is not None
            and presented is not None
            and hmac.compare_digest(presented.encode(), self._token)
        )


def _bearer(metadata: Metadata) -> str | None:
    values = [value for key, value in metadata if key.lower() == AUTHORIZATION_HEADER]
    if len(values) != 1 or isinstance(values[0], bytes):
        return None
    value = values[0]
    if value[: len(BEARER)].lower() != BEARER:
        return None
    return value[len(BEARER) :].strip()

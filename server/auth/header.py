"""`--auth header`: today's trusted `x-owner-id` header, and the one shared
worker token (LEASEHOLD_WORKER_TOKEN) for WorkerService.

Right on loopback or behind a gateway that has already authenticated the
caller; `serve` refuses to listen beyond loopback in this mode without TLS
unless told to (AuthSettings.check_listen). There is no admin role here.
"""

from __future__ import annotations

import grpc

from leasehold._server.api.owner import HeaderOwnerResolver
from leasehold._server.api.worker_auth import WorkerAuth
from leasehold._server.auth.identity import WORKER, Identity, Role, refusal


class HeaderAuthenticator:
    def __init__(self, worker_token: str | None) -> None:
        self._owners = HeaderOwnerResolver()
        self._workers = WorkerAuth(worker_token)

    def authenticate(self, context: grpc.aio.ServicerContext, wanted: Role) -> Identity:
        metadata = context.invocation_metadata() or ()
        # The worker token wins over an owner header beside it: a worker
        # credential never acts as an owner (the gate refuses the role).
        if self._workers.is_worker_credential(metadata):
            return WORKER
        if wanted is Role.WORKER:
            self._workers.check(metadata)  # raises, saying what is missing or wrong
        if wanted is Role.ADMIN:
            raise refusal(wanted, "--auth header has no admin role: use --auth token, jwt or mtls")
        return Identity.owner(self._owners.resolve(metadata))

    def reload(self) -> None:
        """Nothing to re-read: the header is trusted, the worker token is fixed."""

"""What every RPC passes through before its servicer runs (method_handlers.py):
the caller's identity, the role its service needs, the per-owner limit on
unary calls in flight, and the log context that names the method and owner.

Servicers read the checked identity with `caller()` / `calling_owner()`; they
never look at credentials themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import grpc
import structlog

from leasehold._server.api.stream_credentials import StreamCredentials
from leasehold._server.auth.authenticator import Authenticator
from leasehold._server.auth.identity import Identity, Role, RoleNotPermitted, refusal
from leasehold._server.jobs.errors import LimitExceeded

# Enough for a client that fans out (group commit rewards concurrent Enqueues), few
# enough that one owner cannot hold the whole server's memory and database queue.
DEFAULT_MAX_CALLS_PER_OWNER = 1000
CALLS_LIMIT = "max-calls-per-owner"

_CALLER: ContextVar[Identity | None] = ContextVar("leasehold_caller", default=None)


def caller() -> Identity:
    """The identity the gate checked for this call."""
    identity = _CALLER.get()
    if identity is None:  # a servicer reached without its gate: refuse, never guess
        raise refusal(Role.OWNER, "no credential was checked for this call")
    return identity


def calling_owner() -> str:
    """The owner this call acts as (the gate admitted only owners)."""
    identity = caller()
    if identity.owner_id is None:
        raise refusal(Role.OWNER, f"a {identity.role} credential cannot act as an owner")
    return identity.owner_id


class OwnerCallLimit:
    """Unary calls in flight per owner, in this process."""

    def __init__(self, maximum: int = DEFAULT_MAX_CALLS_PER_OWNER) -> None:
        self.maximum = maximum
        self._in_flight: dict[str, int] = {}

    @contextlib.contextmanager
    def held(self, owner: str) -> Iterator[None]:
        count = self._in_flight.get(owner, 0)
        if count >= self.maximum:
            # RESOURCE_EXHAUSTED, reason MAX_CALLS_PER_OWNER_EXCEEDED, as every limit.
            raise LimitExceeded(CALLS_LIMIT, self.maximum, "too many calls in flight for this owner")
        self._in_flight[owner] = count + 1
        try:
            yield
        finally:
            left = self._in_flight[owner] - 1
            if left:
                self._in_flight[owner] = left
            else:
                del self._in_flight[owner]


@dataclass(frozen=True)
class CallGate:
    """One service's gate: who may call it, and how many calls each owner may
    have in flight."""

    authenticator: Authenticator
    role: Role
    limit: OwnerCallLimit
    # Shared by every service's gate: the open streams a reload re-checks.
    streams: StreamCredentials = field(default_factory=StreamCredentials)

    def recheck(self, context: grpc.aio.ServicerContext, admitted: Identity) -> Identity:
        """The caller's credential checked again, for a stream already open:
        refused if it no longer passes, or if it now names another caller."""
        identity = self.authenticator.authenticate(context, self.role)
        if (identity.role, identity.owner_id) != (admitted.role, admitted.owner_id):
            raise refusal(self.role, "the credential now names another caller: open the stream again")
        return identity

    @contextlib.contextmanager
    def admitted(self, context: grpc.aio.ServicerContext, *, unary: bool) -> Iterator[Identity]:
        """Checks the caller (raising the refusal), names its owner in the log
        context, and counts the call while it runs. Streaming calls are not
        counted here (their own limits are)."""
        identity = self.authenticator.authenticate(context, self.role)
        if identity.role is not self.role:
            if self.role is Role.ADMIN:  # a known caller, not allowed (AdminService's contract)
                raise RoleNotPermitted(
                    f"this service needs the admin role; the credential is for the {identity.role} role"
                )
            raise refusal(self.role, _wrong_role(identity.role, self.role))
        if identity.owner_id is not None:
            structlog.contextvars.bind_contextvars(owner_id=identity.owner_id)
        previous = _CALLER.get()
        _CALLER.set(identity)
        try:
            if unary and identity.owner_id is not None:
                with self.limit.held(identity.owner_id):
                    yield identity
            else:
                yield identity
        finally:
            # set, not reset(token): a stream's generator may be closed in another context.
            _CALLER.set(previous)


@contextlib.contextmanager
def call_log_context(method: str) -> Iterator[None]:
    """Every record logged while serving the call (its error included) names
    the method, and the owner and job once the call has named them."""
    structlog.contextvars.bind_contextvars(method=method)
    try:
        yield
    finally:
        structlog.contextvars.unbind_contextvars(*LOG_KEYS)


LOG_KEYS = ("method", "owner_id", "job_id")


def name_job(job_id: str) -> str:
    """Adds the (validated) job id a call names to its log context, and returns
    it; call_log_context unbinds it."""
    structlog.contextvars.bind_contextvars(job_id=job_id)
    return job_id


def _wrong_role(has: Role, wanted: Role) -> str:
    if wanted is Role.OWNER:
        return f"a {has} credential cannot act as an owner"
    return f"a {has} credential cannot call a service for the {wanted} role"

"""The identity a call resolves to, the role syntax every mode shares, and the
refusals (all UNAUTHENTICATED) an authenticator or the role check raises.

A role is written the same way in a token file, a JWT role claim and an mTLS
certificate's `leasehold:` URI: `owner:<id>`, `worker`, `worker:<kind
pattern>,...` or `admin`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from leasehold._server.jobs.routing import KindPatterns

OWNER_PATTERN = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
ROLE_SYNTAX = "owner:<id>, worker, worker:<kind pattern>,... or admin"


class Role(StrEnum):
    OWNER = "owner"
    WORKER = "worker"
    ADMIN = "admin"


@dataclass(frozen=True)
class Identity:
    """A checked caller. `owner_id` is set for (only) the owner role; `kinds`
    limits a worker to kinds its patterns match (None: every remote kind)."""

    role: Role
    owner_id: str | None = None
    kinds: KindPatterns | None = None
    # When the credential stops being accepted (a JWT's exp plus the leeway),
    # as a Unix time; None: until the credentials are reloaded without it.
    expires_at: float | None = None

    @classmethod
    def owner(cls, owner_id: str) -> Identity:
        if OWNER_PATTERN.fullmatch(owner_id) is None:
            raise ValueError("an owner id is 1-128 characters of [A-Za-z0-9._:@-]")
        return cls(Role.OWNER, owner_id=owner_id)

    def may_claim(self, kind: str) -> bool:
        return self.kinds is None or self.kinds.matches(kind)

    def describe(self) -> str:
        """The role as written in a token file (never a credential)."""
        if self.role is Role.OWNER:
            return f"owner:{self.owner_id}"
        if self.role is Role.WORKER and self.kinds is not None:
            return "worker:" + ",".join(self.kinds.describe())
        return self.role.value


WORKER = Identity(Role.WORKER)
ADMIN = Identity(Role.ADMIN)


def parse_role(text: str) -> Identity:
    """`owner:<id>`, `worker[:<pattern>,...]` or `admin`. The ValueError never
    repeats the text: a misplaced secret in a role field must not reach a log."""
    name, sep, rest = text.partition(":")
    try:
        if name == Role.OWNER and sep:
            return Identity.owner(rest)
        if name == Role.WORKER and not sep:
            return WORKER
        if name == Role.WORKER and rest:
            return Identity(Role.WORKER, kinds=KindPatterns.parse(rest.split(","), field="worker"))
        if name == Role.ADMIN and not sep:
            return ADMIN
    except ValueError:
        pass
    raise ValueError(f"a role is {ROLE_SYNTAX} (a kind pattern is a kind or a prefix such as media.*)")


class Unauthenticated(Exception):
    """The call has no acceptable credential for what it asks. UNAUTHENTICATED."""

    reason = "UNAUTHENTICATED"


class OwnerUnresolved(Unauthenticated):
    """No owner identity (JobService and ScheduleService)."""

    reason = "OWNER_UNRESOLVED"


class WorkerUnauthenticated(Unauthenticated):
    """No worker identity (WorkerService)."""

    reason = "WORKER_UNAUTHENTICATED"


class AdminUnauthenticated(Unauthenticated):
    """No admin identity (AdminService)."""

    reason = "ADMIN_UNAUTHENTICATED"


_REFUSALS: dict[Role, type[Unauthenticated]] = {
    Role.OWNER: OwnerUnresolved,
    Role.WORKER: WorkerUnauthenticated,
    Role.ADMIN: AdminUnauthenticated,
}


def refusal(wanted: Role, message: str) -> Unauthenticated:
    """The refusal for a call that needs `wanted`: one ErrorInfo reason per
    service, whatever the auth mode."""
    return _REFUSALS[wanted](message)


class RoleNotPermitted(Exception):
    """A checked credential of another role called AdminService: the caller is
    known, and is not allowed. PERMISSION_DENIED, reason ADMIN_ROLE_REQUIRED."""

    reason = "ADMIN_ROLE_REQUIRED"


class KindsNotPermitted(Exception):
    """A worker limited to some kind patterns asked to claim another kind.
    PERMISSION_DENIED naming the field."""

    def __init__(self, field: str, kind: str) -> None:
        super().__init__(f"this worker credential may not claim {kind!r}")
        self.field = field

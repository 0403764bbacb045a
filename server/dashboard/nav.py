"""The header's navigation: one entry per page, each with who may see it, so a
new page is one more line here (and its route) rather than a template edit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from leasehold._server.dashboard.sessions import Session


def everyone(session: Session) -> bool:
    return True


def owners(session: Session) -> bool:
    """JobService and ScheduleService act as the caller's owner: an admin
    credential is refused there."""
    return not session.is_admin


def admins(session: Session) -> bool:
    return session.is_admin


@dataclass(frozen=True)
class NavEntry:
    label: str
    route: str  # the Starlette route name its link goes to
    shown_to: Callable[[Session], bool] = everyone


NAV = (
    NavEntry("Overview", "overview"),
    NavEntry("Jobs", "jobs"),
    NavEntry("Schedules", "schedules", owners),
    NavEntry("Workers", "workers", admins),
)


def entries_for(session: Session | None, nav: tuple[NavEntry, ...] = NAV) -> list[NavEntry]:
    """The entries `session` may follow (none before sign-in)."""
    if session is None:
        return []
    return [entry for entry in nav if entry.shown_to(session)]

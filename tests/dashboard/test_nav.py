"""The header's navigation is a list of entries, each shown to the roles its
predicate admits: Schedules to owners only (ScheduleService refuses an admin),
Workers to admins only (ListWorkers refuses an owner)."""

from __future__ import annotations

from datetime import UTC, datetime

from leasehold._server.dashboard.nav import NAV, NavEntry, admins, entries_for
from leasehold._server.dashboard.sessions import Credential, Session

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def session(is_admin: bool) -> Session:
    return Session("s", Credential("token", "t"), is_admin, NOW, NOW, None if is_admin else "ann")


def test_an_owner_sees_schedules_and_not_workers_and_an_admin_the_reverse() -> None:
    assert [entry.label for entry in entries_for(session(is_admin=False))] == [
        "Overview",
        "Jobs",
        "Schedules",
    ]
    assert [entry.label for entry in entries_for(session(is_admin=True))] == ["Overview", "Jobs", "Workers"]
    assert entries_for(None) == []


def test_an_entry_for_admins_only_is_one_more_line() -> None:
    nav = (*NAV, NavEntry("Audit", "audit", admins))
    assert [entry.label for entry in entries_for(session(is_admin=True), nav)][-1] == "Audit"
    assert "Audit" not in [entry.label for entry in entries_for(session(is_admin=False), nav)]


def test_the_header_names_the_owner_or_the_admin() -> None:
    assert session(is_admin=False).who == "owner ann"
    assert session(is_admin=True).who == "admin"

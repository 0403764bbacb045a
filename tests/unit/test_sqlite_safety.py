"""Which SQLite versions have the WAL-reset bug, and which setups it can bite
(server/jobs/sql/sqlite_safety.py)."""

from __future__ import annotations

import pytest

from leasehold._server.jobs.sql.sqlite_safety import Sharing, is_affected, wal_reset_warning


@pytest.mark.parametrize(
    ("version", "affected"),
    [
        ((3, 6, 23), False),  # before WAL existed
        ((3, 7, 0), True),  # WAL's first release
        ((3, 40, 1), True),  # Debian 12
        ((3, 44, 5), True),
        ((3, 44, 6), False),  # the 3.44 backport
        ((3, 45, 0), True),
        ((3, 50, 6), True),
        ((3, 50, 7), False),  # the 3.50 backport
        ((3, 51, 2), True),
        ((3, 51, 3), False),  # the fix
        ((3, 52, 0), False),
        ((3, 53, 0), False),
        ((4, 0, 0), False),
    ],
)
def test_affected_versions(version: tuple[int, int, int], affected: bool) -> None:
    assert is_affected(version) is affected


def test_a_shared_file_on_an_affected_version_is_warned_about_with_the_remedy() -> None:
    message = wal_reset_warning((3, 40, 1), Sharing.SHARED)

    assert message is not None
    assert message.startswith("SQLite 3.40.1 has the WAL-reset bug")
    for remedy in (
        "3.51.3",
        "LD_LIBRARY_PATH",
        "pysqlite3-binary does not help",
        "only this process",
        "PostgreSQL",
    ):
        assert remedy in message, remedy


@pytest.mark.parametrize(
    ("version", "sharing"),
    [((3, 40, 1), Sharing.SOLE_WRITER), ((3, 51, 3), Sharing.SHARED), ((3, 50, 7), Sharing.SHARED)],
)
def test_no_warning_where_the_bug_cannot_bite(version: tuple[int, int, int], sharing: Sharing) -> None:
    assert wal_reset_warning(version, sharing) is None

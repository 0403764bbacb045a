"""Whether the linked SQLite can corrupt a Leasehold file through the WAL-reset
bug, and what the operator can do about it.

The bug (https://sqlite.org/wal.html#walresetbug, found and fixed 2026-03-03): a
data race in WAL mode. One connection completes a checkpoint and at once starts
another; while the second runs, a different connection commits a transaction
that resets the WAL (starts writing it again from the beginning); the second
checkpoint misses the reset and leaves a wrong "already backfilled" mark in the
WAL-index header, and a later checkpoint skips pages that were never copied into
the database: lost commits, a corrupt file. It needs WAL mode, two or more
connections (threads or processes) on one file, and two of them writing or
checkpointing at the same moment. Every SQLite from 3.7.0 (WAL's first release)
to 3.51.2 has it; 3.51.3 (2026-03-13) fixed it (3.52.0, withdrawn, and 3.53.0
have the fix too), and the 3.44.6 and 3.50.7 patch releases carry it back.

Where it can bite Leasehold. Within one process every write and every
checkpoint of the file go through one connection, the writer (a checkpoint is
run by the connection whose commit grows the WAL past its threshold, so it is
the writer's, in line with its own commits). The read pool never writes, so it
never checkpoints, except the checkpoint a connection runs as it closes when it
is the last one on the file: nothing else is open then to race it. So one
`leasehold serve` alone on its file is safe. A second writer or checkpointer is
what it takes: another `serve` on the same file (which Leasehold supports), a
`leasehold migrate` or a sqlite3 shell writing a live file, a backup or
replication tool that checkpoints it (Litestream does), or a second app on the
file within one process. The server cannot know at start whether one will
come, so `serve` reports its setup as SHARED; SOLE_WRITER is for a setup that
rules the others out.

The check goes by version number. A distribution may backport the fix without
changing it (Debian 12's 3.40.1-2+deb12u2 has not): if yours did, its changelog
says so and the warning can be ignored.
"""

from __future__ import annotations

import sqlite3
from enum import Enum

import structlog

log = structlog.get_logger("leasehold.storage")

Version = tuple[int, int, int]

FIRST_AFFECTED: Version = (3, 7, 0)
FIXED: Version = (3, 51, 3)
# Older release branches whose later patch releases carry the fix: (major, minor) -> patch.
FIXED_BACKPORTS = {(3, 44): 6, (3, 50): 7}

REMEDY = (
    "upgrade the SQLite that Python's sqlite3 module loads to 3.51.3 or later (3.50.7+ and 3.44.6+ "
    "are fixed too): your distribution's libsqlite3, or a libsqlite3.so.0 built from sqlite.org "
    "found first through LD_LIBRARY_PATH (where the module links it dynamically, as distribution "
    "and pyenv Pythons do), or a Python that bundles a fixed SQLite; pip install pysqlite3-binary "
    "does not help, Leasehold's drivers import the standard sqlite3 module. Until then let only "
    "this process open the file (no second serve, no migrate, sqlite3 shell or checkpointing "
    "backup tool while it runs), or use PostgreSQL for several processes"
)


class Sharing(Enum):
    """Who else may write or checkpoint the database file."""

    SOLE_WRITER = "sole_writer"  # nothing but this process's one writer connection
    SHARED = "shared"  # other processes (or connections) may: what `serve` gives


def is_affected(version: Version) -> bool:
    """Whether SQLite `version` has the WAL-reset bug."""
    if not FIRST_AFFECTED <= version < FIXED:
        return False
    backport = FIXED_BACKPORTS.get(version[:2])
    return backport is None or version[2] < backport


def wal_reset_warning(version: Version, sharing: Sharing) -> str | None:
    """Why this setup is exposed and what to do, or None when it is not: the
    version must have the bug and someone besides this process's writer must be
    able to write or checkpoint the file."""
    if sharing is Sharing.SOLE_WRITER or not is_affected(version):
        return None
    return (
        f"SQLite {'.'.join(map(str, version))} has the WAL-reset bug "
        "(https://sqlite.org/wal.html#walresetbug): it can corrupt this database if another "
        "process writes or checkpoints the file while this one does; to fix it, " + REMEDY
    )


def warn_if_exposed(sharing: Sharing = Sharing.SHARED, version: Version | None = None) -> None:
    """Log `storage.sqlite_wal_reset_bug` once per call when `wal_reset_warning` applies
    to the linked SQLite (or `version`)."""
    found = version or sqlite3.sqlite_version_info
    message = wal_reset_warning(found, sharing)
    if message is not None:
        log.warning(
            "storage.sqlite_wal_reset_bug",
            sqlite_version=".".join(map(str, found)),
            fixed_in=".".join(map(str, FIXED)),
            message=message,
        )

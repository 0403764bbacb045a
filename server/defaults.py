"""Where a setting comes from when no flag gives it: LEASEHOLD_<NAME>, else the
default here.

This module imports nothing of the service, so that the command line can build
its whole parser (every `--help` names these defaults) and run a client command
without importing the stack a default configures: SQLAlchemy for the pool, the
runtime for the execution slots.
"""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./leasehold.db"
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_RETENTION = "7d"
# DESIGN §13's drain: how long running handlers get to finish on SIGTERM/SIGINT.
DEFAULT_SHUTDOWN_GRACE_SECONDS = 20.0
# A handler emitting more is most likely looping; a watcher replaying the log
# stays a few seconds' read.
DEFAULT_MAX_EVENTS_PER_JOB = 10_000
# Read connections per process, unless `--database-pool-size` says otherwise. The
# writer and (on PostgreSQL) the notification listener and retention's writer hold one
# more each.
DEFAULT_POOL_SIZE = 20
# Execution slots when nothing says otherwise: a service's, not a laptop's. A
# slot costs nothing while idle, and a claim fills every free slot in one
# transaction, so more slots mean fewer, fuller writes. On the benchmark machine
# (two cores) a drain rose with slots up to 64 and fell beyond it (docs/performance.md);
# a handler that holds the CPU belongs in `leasehold worker`
# processes whatever the number.
DEFAULT_CONCURRENCY = 64


def env(name: str) -> str | None:
    """LEASEHOLD_<NAME> from the environment, if set and not empty."""
    value = os.environ.get(f"LEASEHOLD_{name}")
    return value or None


def env_true(name: str) -> bool:
    """Whether LEASEHOLD_<NAME> turns a switch on (1, true or yes)."""
    return (env(name) or "").lower() in ("1", "true", "yes")

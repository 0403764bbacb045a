"""The bench's PostgreSQL: one durable throwaway cluster per run, and fresh databases on it.

The cluster (tests.postgres_cluster, `durable=True`: fsync and full-page writes on, PostgreSQL's
defaults, as in production) starts the first time a group asks for it and is destroyed when the
suite ends, so a run that selects no PostgreSQL group never pays for `initdb`. Every figure gets
a database of its own. Seeding 10,000 jobs through a durable cluster takes a while, so, as with
the SQLite templates, a seeded database is made once per run and each round gets a copy
(`CREATE DATABASE ... TEMPLATE`, a file copy).

Missing PostgreSQL binaries are an error, not a skip: a run that was asked for PostgreSQL
figures and silently has none would read like a run that measured them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from bench.common import BenchError, progress
from tests.postgres_cluster import PostgresCluster, find_bin_dir

MISSING_BINARIES = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in "
    "/usr/lib/postgresql/*/bin: install PostgreSQL, or leave the PostgreSQL groups out "
    "(--no-postgres, or --only without them)"
)


@dataclass(frozen=True)
class PgDatabase:
    """One database on the run's cluster, with the two spellings of where it is."""

    name: str
    url: str  # for Leasehold (postgresql+psycopg://...)
    conninfo: str  # for psycopg directly

    @property
    def dsn(self) -> str:
        """A libpq URL, for asyncpg (pgqueuer)."""
        return self.url.replace("postgresql+psycopg://", "postgresql://", 1)


class BenchPostgres:
    """The run's cluster, started on first use, and its seeded-once template databases."""

    def __init__(self) -> None:
        self._cluster: PostgresCluster | None = None
        self._failure: str | None = None
        self._templates: dict[str, str] = {}
        self._lock = threading.Lock()

    def _started(self) -> PostgresCluster:
        if self._failure is not None:
            raise BenchError(self._failure)
        if self._cluster is None:
            bin_dir = find_bin_dir()
            if bin_dir is None:
                self._failure = MISSING_BINARIES
                raise BenchError(MISSING_BINARIES)
            progress(f"starting a durable throwaway PostgreSQL cluster from {bin_dir} (once per run)")
            cluster = PostgresCluster(bin_dir, durable=True)
            try:
                cluster.init().start()
            except BaseException as exc:
                cluster.destroy()
                self._failure = f"could not start PostgreSQL: {exc}"
                raise
            self._cluster = cluster
        return self._cluster

    def _database(self, name: str) -> PgDatabase:
        cluster = self._started()
        return PgDatabase(name, cluster.url(name), cluster.conninfo(name))

    def database(self, prefix: str, template: str | None = None) -> PgDatabase:
        """A new database: empty, or a copy of the template database named `template`."""
        with self._lock:
            return self._database(self._started().create_database(template=template, prefix=prefix))

    def template(self, key: str, make: Callable[[PgDatabase], None]) -> str:
        """The name of the template database `key`, made by `make` on the first call of the run.
        `make` must close every connection it opens: a template is copied only when nobody is
        connected to it."""
        with self._lock:
            if key not in self._templates:
                progress(f"seeding PostgreSQL template {key} (once per run)")
                database = self._database(self._started().create_database(prefix="template"))
                make(database)
                self._templates[key] = database.name
            return self._templates[key]

    def close(self) -> None:
        """Stop the cluster and delete its files (a no-op when it never started)."""
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.destroy()


def vacuum_analyze(database: PgDatabase) -> None:
    """VACUUM (ANALYZE) every table of `database`: a seeded template starts as tidy, and with as
    fresh planner statistics, as a table that autovacuum has caught up with."""
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")

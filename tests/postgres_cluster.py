"""A throwaway PostgreSQL cluster from the installed binaries, for tests and
benchmarks: `initdb` into a fresh directory, `pg_ctl` on a free loopback port,
trust authentication for one superuser, gone when stopped.

PostgreSQL refuses to run as root; under root the cluster runs as the
`postgres` system user (or `nobody`), which then owns its directory.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

SUPERUSER = "leasehold"
SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")


def find_bin_dir() -> Path | None:
    """Where initdb, pg_ctl and postgres are: on PATH, or the newest Debian-style
    /usr/lib/postgresql/N/bin."""
    on_path = [shutil.which(name) for name in SERVER_BINARIES]
    if all(on_path):
        return Path(os.path.realpath(on_path[0] or "")).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    for candidate in candidates:
        if all((Path(candidate) / name).exists() for name in SERVER_BINARIES):
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as() -> str | None:
    """The user to run the server as, when this process is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


class PostgresCluster:
    """`durable=False` (for tests) turns off fsync and full-page writes: a crash
    of the machine could lose the cluster, which a throwaway one may. Benchmarks
    keep PostgreSQL's durable defaults, as a production cluster would."""

    def __init__(
        self,
        bin_dir: Path,
        durable: bool = False,
        max_connections: int = 400,
        listen: tuple[str, ...] = ("127.0.0.1",),
        trust: tuple[str, ...] = (),
    ) -> None:
        """`listen`: the addresses it listens on; `trust`: networks (CIDR) besides
        loopback whose connections it lets in without a password."""
        self.bin_dir = bin_dir
        self.listen = listen
        self.trust = trust
        self.durable = durable
        self.max_connections = max_connections
        self.port = free_port()
        self.user = _run_as()
        self.base = Path(tempfile.mkdtemp(prefix="leasehold-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self._names = itertools.count(1)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)

    # ----- lifecycle -----------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120.0) -> None:
        """Run one of the server's programs, as the cluster's user. Through
        `runuser`, not `subprocess.run(user=...)`: a `user` makes subprocess
        fork() instead of vfork(), and fork() in a process with live gRPC threads
        (any test process once a test made a call) crashes the child in gRPC's
        fork handlers."""
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        result = subprocess.run(
            command, cwd=self.base, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{output}")

    def init(self) -> PostgresCluster:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", SUPERUSER, "-E", "UTF8", "--no-sync")
        settings = [
            f"listen_addresses = '{','.join(self.listen)}'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.base}'",
            f"max_connections = {self.max_connections}",
            "shared_buffers = '128MB'",
        ]
        if not self.durable:
            settings += ["fsync = off", "full_page_writes = off", "synchronous_commit = off"]
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# leasehold throwaway cluster\n" + "\n".join(settings) + "\n")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.writelines(f"host all all {network} trust\n" for network in self.trust)
        return self

    def start(self) -> PostgresCluster:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` disconnects every session and shuts down
        cleanly; `immediate` is a crash (recovery runs at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        """Stop the server and delete its files. A whole suite's cluster holds a
        database per test, gigabytes in all, which a loaded disk takes minutes to
        delete: the deletion goes on in a process of its own, so the last
        test's teardown (and its timeout) does not wait for it."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        doomed = self.base.with_name(self.base.name + ".deleting")
        try:
            self.base.rename(doomed)
        except OSError:
            shutil.rmtree(self.base, ignore_errors=True)
            return
        # The shell returns at once, leaving rm to the system (nothing to reap here).
        subprocess.run(
            ["sh", "-c", 'rm -rf -- "$1" >/dev/null 2>&1 &', "sh", str(doomed)],
            stdin=subprocess.DEVNULL,
            check=False,
            start_new_session=True,
        )

    # ----- databases ---------------------------------------------------------------------

    def url(self, database: str, host: str = "127.0.0.1") -> str:
        """The service's URL of `database`, reached at `host`."""
        return f"postgresql+psycopg://{SUPERUSER}@{host}:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        """A libpq connection string, for psycopg directly."""
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.conninfo(database), autocommit=True)

    def create_database(self, template: str | None = None, prefix: str = "db") -> str:
        """A new, empty database (a copy of `template`, if given); returns its name."""
        name = f"{prefix}_{next(self._names)}"
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement = sql.SQL("{} TEMPLATE {} STRATEGY FILE_COPY").format(
                statement, sql.Identifier(template)
            )
        with self.connect() as conn:
            conn.execute(statement)
        return name

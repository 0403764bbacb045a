"""A PostgreSQL pair under pg_auto_failover, for the failover experiments.

A monitor and two nodes (`pg_autoctl`, Debian's postgresql-15-auto-failover),
each a process group of its own under one temporary directory, on loopback
ports, as the unprivileged user PostgreSQL runs as. The monitor decides every
switch, as it would in production; only its health-check timings are shortened
(`MONITOR_TIMINGS`), so a dead primary is replaced in seconds rather than the
default minute.

Killing the primary kills its whole node (keeper and postgres), as a machine
that dies would; `rejoin` starts it again, and its keeper brings it back as
the new primary's standby.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.postgres_cluster import _run_as, free_port

DATABASE = "leasehold"
# The monitor's health checks, shortened for a test (production keeps the
# defaults: 20 s before a node is unhealthy, 30 s before a primary is demoted).
MONITOR_TIMINGS = {
    "health_check_period": 500,
    "health_check_timeout": 500,
    "health_check_max_retries": 1,
    "health_check_retry_delay": 200,
    "node_considered_unhealthy_timeout": 1000,
    "primary_demote_timeout": 1000,
}


def find_pg_autoctl() -> str | None:
    return shutil.which("pg_autoctl")


@dataclass
class Node:
    name: str
    port: int
    data: Path
    process: subprocess.Popen[bytes] | None = None


class AutoFailoverPair:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.user = _run_as()
        self.base = Path(tempfile.mkdtemp(prefix="leasehold-autofailover-"))
        self.monitor = Node("monitor", free_port(), self.base / "monitor")
        self.nodes = [Node(f"node{i}", free_port(), self.base / f"node{i}") for i in (1, 2)]
        if self.user is not None:
            os.chown(self.base, *_ids(self.user))

    # ----- processes -------------------------------------------------------------------

    def _spawn(self, node: Node, *args: str) -> None:
        """`pg_autoctl ARGS --run`, as the cluster's user, in a session of its own
        (so that killing the node kills its keeper and its postgres together).
        Its configuration lives under this pair's directory, not the user's home."""
        env = {
            **os.environ,
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "XDG_CONFIG_HOME": str(self.base / "config"),
            "XDG_DATA_HOME": str(self.base / "share"),
            "PG_AUTOCTL_DEBUG": "0",
        }
        command = ["pg_autoctl", *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        log = (self.base / f"{node.name}.log").open("ab")
        node.process = subprocess.Popen(
            command,
            cwd=self.base,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

    def _monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover?sslmode=disable"

    def start(self, timeout: float = 120.0) -> AutoFailoverPair:
        self._spawn(
            self.monitor,
            *("create", "monitor", "--pgdata", str(self.monitor.data), "--pgport", str(self.monitor.port)),
            *("--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run"),
        )
        self._until(
            lambda: self._monitor_sql("SELECT 1") is not None, timeout, "the monitor to accept connections"
        )
        for setting, value in MONITOR_TIMINGS.items():
            self._monitor_sql(f"ALTER SYSTEM SET pgautofailover.{setting} = {value}")
        self._monitor_sql("SELECT pg_reload_conf()")
        first, second = self.nodes
        self._create(first)
        self._until(
            lambda: self.role(first) in ("single", "primary", "wait_primary"), timeout, "node1 to be primary"
        )
        self._create(second)
        self.until_replicating(timeout)
        return self

    def _create(self, node: Node) -> None:
        self._spawn(
            node,
            *("create", "postgres", "--pgdata", str(node.data), "--pgport", str(node.port)),
            *("--hostname", "127.0.0.1", "--name", node.name, "--auth", "trust", "--no-ssl"),
            *("--monitor", self._monitor_uri(), "--dbname", DATABASE, "--run"),
        )

    def kill(self, node: Node) -> None:
        """SIGKILL the node's keeper and postgres at once: the machine died."""
        if node.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGKILL)
            node.process.wait(30)
            node.process = None
        # A postgres the keeper started may have outlived its group's kill by a moment.
        self._until(lambda: not _accepts(node.port), 30, f"{node.name} to be down")

    def rejoin(self, node: Node, timeout: float = 120.0) -> None:
        """Start a killed node again; its keeper makes it the standby of
        whichever node is primary now, and this returns once replication is
        synchronous again."""
        self._spawn(node, "run", "--pgdata", str(node.data))
        self.until_replicating(timeout)

    def destroy(self) -> None:
        for node in (*self.nodes, self.monitor):
            if node.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.process.wait(30)
        shutil.rmtree(self.base, ignore_errors=True)

    # ----- what the monitor says ------------------------------------------------------------

    def _monitor_sql(self, statement: str) -> list[tuple[object, ...]] | None:
        try:
            with psycopg.connect(
                host="127.0.0.1",
                port=self.monitor.port,
                user="postgres",
                dbname="pg_auto_failover",
                autocommit=True,
                connect_timeout=2,
            ) as conn:
                cursor = conn.execute(statement)  # type: ignore[arg-type]
                return cursor.fetchall() if cursor.description else []
        except psycopg.Error:
            return None

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported, assigned) state, as the monitor has them."""
        found = self._monitor_sql("SELECT nodename, reportedstate, goalstate FROM pgautofailover.node") or []
        return {str(name): (str(reported), str(goal)) for name, reported, goal in found}

    def role(self, node: Node) -> str | None:
        state = self.states().get(node.name)
        return state[0] if state is not None and state[0] == state[1] else None

    def primary(self) -> Node:
        for node in self.nodes:
            if self.role(node) in ("primary", "wait_primary", "single"):
                return node
        raise AssertionError(f"no primary: {self.states()}")

    def _settled(self) -> bool:
        return sorted(role or "-" for role in (self.role(node) for node in self.nodes)) == [
            "primary",
            "secondary",
        ]

    def until_replicating(self, timeout: float) -> None:
        """Until one node is primary and the other its synchronous standby. A
        new standby's base backup waits for a checkpoint on the primary, which
        an idle primary may not take for minutes: ask for one meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            if self._settled():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for replication: {self.states()}")
            for node in self.nodes:
                if _accepts(node.port):
                    with contextlib.suppress(psycopg.Error):
                        with psycopg.connect(
                            **self._node_args(node), autocommit=True, connect_timeout=2
                        ) as conn:
                            if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:  # type: ignore[index]
                                conn.execute("CHECKPOINT")
            time.sleep(0.5)

    def replicate_asynchronously(self, timeout: float = 30.0) -> None:
        """Take both nodes out of the replication quorum: the primary commits
        without waiting for its standby (`synchronous_standby_names` empty), the
        setting that trades what a failover may lose for each commit's wait."""
        for node in self.nodes:
            self._monitor_sql(
                f"SELECT pgautofailover.set_node_replication_quorum('default', '{node.name}', false)"
            )
        self._until(
            lambda: self._settled() and not self.synchronous(),
            timeout,
            "the primary to stop waiting for its standby",
        )

    def synchronous(self) -> bool:
        """Whether the primary commits only once its standby has the WAL: the
        documented setting (a synchronous standby, `synchronous_commit = on`)."""
        with psycopg.connect(**self._node_args(self.primary()), autocommit=True, connect_timeout=2) as conn:
            names = conn.execute("SHOW synchronous_standby_names").fetchone()
            commit = conn.execute("SHOW synchronous_commit").fetchone()
        return bool(names and names[0]) and commit is not None and commit[0] == "on"

    def _node_args(self, node: Node) -> dict[str, object]:
        return {"host": "127.0.0.1", "port": node.port, "user": "postgres", "dbname": DATABASE}

    def url(self) -> str:
        """Leasehold's URL of the pair: both hosts, so every connection finds
        whichever is primary (Leasehold asks for read-write by itself)."""
        hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql+psycopg://postgres@/{DATABASE}?{hosts}"

    def _until(self, done: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}: {self.states()}")
            time.sleep(0.2)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid

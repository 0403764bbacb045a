"""`serve --processes N`: N serving processes on one address and one database,
so that one machine's cores serve one address (DESIGN §20).

This process is their supervisor and serves nothing itself. It checks the
settings once, brings the schema up to date once, holds the listen address
with SO_REUSEPORT so that only its children can share it, then starts N
`serve` processes with the same flags plus their slot.
Each child is a full replica: it binds the shared address with SO_REUSEPORT
(the kernel spreads new connections over them), runs its own runtime, and
tells its siblings what it commits (`jobs.sibling_bus`; on PostgreSQL the
NOTIFY every replica hears does that already). Metrics: each child serves
its own on the port after its previous sibling's. The dashboard is the first
child's alone: its sign-in sessions live in that process, and it sees every
process's work through the shared database and the sibling bus.

Signals are the operator's interface, as for one process: SIGINT or SIGTERM
drains every child at once (health turns NOT_SERVING on all of them), a second
cuts their grace short, SIGHUP makes each re-read its credentials. The children
are in a process group of their own, so a terminal's Ctrl-C reaches them once,
through here. If a child exits by itself, the others are drained and the
supervisor exits with that child's status, so a process manager sees the
failure (restarting one child alone would hide a crash loop). If the
supervisor dies, each child sees its pipe close and drains.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

import structlog

from leasehold._server.addresses import hold_shared
from leasehold._server.config import Settings
from leasehold._server.jobs.sibling_bus import SiblingGroup
from leasehold._server.jobs.sql import sqlite_safety

log = structlog.get_logger("leasehold.cli")

FLAG = "--serve-process"
# Shared by the children, so that a page token one of them signed reads on another.
PAGE_TOKEN_KEY_VARIABLE = "LEASEHOLD_PAGE_TOKEN_KEY"


@dataclass(frozen=True)
class ProcessSlot:
    """What the supervisor tells a child in `--serve-process SLOT:FD:DIR`."""

    slot: int
    supervisor_fd: int
    directory: str

    @classmethod
    def parse(cls, text: str) -> ProcessSlot:
        slot, fd, directory = text.split(":", 2)
        return cls(int(slot), int(fd), directory)

    def __str__(self) -> str:
        return f"{self.slot}:{self.supervisor_fd}:{self.directory}"

    def siblings(self, count: int) -> SiblingGroup:
        return SiblingGroup(self.directory, self.slot, count)


class _Children:
    """The running children by pid, and what the signals asked of them."""

    def __init__(self) -> None:
        self.by_pid: dict[int, int] = {}  # pid -> slot
        self.stopping = False
        self.status = 0

    def signal_all(self, signum: int) -> None:
        for pid in self.by_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            self.stopping = True
            log.info("server.stopping", processes=len(self.by_pid))
        # A child counts its signals: the first drains, a later one hurries the drain.
        self.signal_all(signal.SIGTERM)

    def on_reload_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signal_all(signal.SIGHUP)

    def exited(self, pid: int, code: int) -> None:
        slot = self.by_pid.pop(pid, None)
        if slot is None:
            return
        if code < 0:  # killed by a signal: as a shell reports it
            code = 128 - code
        if self.stopping:
            if code != 0 and self.status == 0:
                self.status = code
            return
        log.error("server.process_exited", process=slot, status=code, message="draining the other processes")
        self.status = code or 1
        self.stopping = True
        self.signal_all(signal.SIGTERM)


def supervise(settings: Settings, argv: Sequence[str]) -> int:
    """Start `settings.processes` children of `leasehold serve argv` and wait
    for them all; the exit status (the first failed child's, else 0)."""
    if settings.database_url.startswith("sqlite"):
        # The processes share the file by design: an SQLite with the WAL-reset bug says so once.
        sqlite_safety.warn_if_exposed(sqlite_safety.Sharing.SHARED)
    held: list[socket.socket] = []
    directory = tempfile.mkdtemp(prefix="leasehold-serve-")  # mode 0700: the siblings' sockets
    children = _Children()
    read_end, write_end = os.pipe()
    try:
        shared, listen = hold_shared("listen", settings.listen)
        held += shared
        overrides = ["--listen", listen]
        environment = dict(os.environ)
        environment.setdefault(PAGE_TOKEN_KEY_VARIABLE, secrets.token_urlsafe(32))
        signal.signal(signal.SIGINT, children.on_stop_signal)
        signal.signal(signal.SIGTERM, children.on_stop_signal)
        signal.signal(signal.SIGHUP, children.on_reload_signal)
        for slot in range(settings.processes):
            if children.stopping:
                break
            place = ProcessSlot(slot, read_end, directory)
            child = subprocess.Popen(
                [sys.executable, "-m", "leasehold", *argv, *overrides, FLAG, str(place)],
                env=environment,
                pass_fds=(read_end,),
                process_group=0,
            )
            children.by_pid[child.pid] = slot
        os.close(read_end)
        read_end = -1
        log.info(
            "server.processes",
            processes=settings.processes,
            listen=listen,
            pids=sorted(children.by_pid),
        )
        while children.by_pid:
            pid, status = os.waitpid(-1, 0)  # a signal's handler runs, then the wait goes on
            children.exited(pid, os.waitstatus_to_exitcode(status))
        return children.status
    finally:
        children.signal_all(signal.SIGKILL)  # only if this process is failing itself
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        for sock in held:
            sock.close()
        shutil.rmtree(directory, ignore_errors=True)

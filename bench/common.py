"""Shared plumbing of the benchmark suite: measurements, statistics, deadlines and SQLite files.

Everything here is small and boring on purpose: a figure module should read as "start these
processes, wait for that, compute this", and the suite's promises (JSON lines, medians, every
wait bounded) live in one place.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parents[1]
OWNER = "bench-owner"
METADATA = (("x-owner-id", OWNER),)


class BenchError(Exception):
    """A benchmark could not produce its figure (a crash, a timeout, a wrong count)."""


class FigureSkipped(Exception):
    """A figure cannot be measured on this build (e.g. the server has no `--event-loop` flag).
    Reported as skipped, not as a crash: the suite still exits 0 for it."""


# ----- measurements -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One figure measured in one round. `side` is "baseline" or "leasehold"."""

    figure: str
    value: float
    unit: str
    side: str
    params: dict[str, Any] = field(default_factory=dict)

    def line(self, round_number: int) -> dict[str, Any]:
        return {
            "kind": "figure",
            "figure": self.figure,
            "round": round_number,
            "value": round(self.value, 4),
            "unit": self.unit,
            "side": self.side,
            "params": self.params,
        }


class Emitter:
    """Writes JSON lines to stdout (and to `--out` when given) as soon as they exist, so a long
    run that dies late still leaves everything it measured."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: dict[str, Any]) -> None:
        self.lines.append(record)
        text = json.dumps(record, sort_keys=False)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        if self._out is not None:
            self._out.write(text + "\n")
            self._out.flush()


def progress(message: str) -> None:
    """A human progress line on stderr (stdout carries only JSON)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# ----- statistics ---------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of nothing")
    return float(statistics.median(values))


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default): p50 of [1, 2] is 1.5."""
    if not values:
        raise ValueError("percentile of nothing")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(seconds: Iterable[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds."""
    values = [s * 1000.0 for s in seconds]
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values),
    }


# ----- deadlines ----------------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll `condition` until true; returns the monotonic time it was seen true. Raises BenchError
    naming `what` after `timeout` seconds. Every wait in the suite has a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# ----- files --------------------------------------------------------------------------------------


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def checkpoint(path: Path) -> None:
    """Fold the write-ahead log into the main file and truncate it, so the file alone is the
    whole database and can be copied. Call only when no other connection is open."""
    conn = sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise BenchError(f"{path}: checkpoint blocked by another connection")
    finally:
        conn.close()


def copy_database(template: Path, target: Path) -> Path:
    """A fresh copy of a checkpointed template (the WAL flag lives in the file header, so the copy
    opens in WAL mode like the original)."""
    shutil.copyfile(template, target)
    return target


def read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to a database another process is writing (WAL readers never block
    the writer)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


def succeeded_jobs(path: Path) -> tuple[int, int | None]:
    """(how many jobs are `succeeded`, the largest `completed_at`), read-only. `completed_at` is
    integer microseconds since the Unix epoch, from the server's wall clock."""
    conn = read_only(path)
    try:
        count, last = conn.execute(
            "SELECT count(*), max(completed_at) FROM jobs WHERE status = 'succeeded'"
        ).fetchone()
    finally:
        conn.close()
    return int(count), None if last is None else int(last)


def read_stamps(path: Path) -> list[tuple[str, int, float]]:
    """Lines of `key sequence monotonic-seconds` written by bench handlers (see bench.handlers)."""
    stamps: list[tuple[str, int, float]] = []
    if not path.exists():
        return stamps
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            stamps.append((parts[0], int(parts[1]), float(parts[2])))
    return stamps


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (/proc/PID/stat, Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """`cpu_seconds` of a process and of its live children (a `serve --processes` and the
    processes it started)."""
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        children = [int(child) for child in listing.read().split()]
    return cpu_seconds(pid) + sum(cpu_seconds(child) for child in children)


def append_line(fd: int, text: str) -> None:
    """One write(2) on an O_APPEND descriptor: atomic for short lines, so threads and tasks can
    share it without a lock."""
    os.write(fd, (text + "\n").encode())


def open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"

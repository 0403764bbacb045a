"""Experiment 7 — disk faults.

Promise (DESIGN §2 status codes, docs/api.md "Errors"): when the disk is full or the
database turns read-only, writes fail fast with RESOURCE_EXHAUSTED or UNAVAILABLE
and a message that names the database (never INTERNAL or UNKNOWN), nothing is
half-written, reads keep working, the runtime keeps running, and once the disk
can take writes again the service carries on: every acknowledged Enqueue is
there, the file passes `PRAGMA integrity_check`, and the jobs run.

How: a real `leasehold serve` whose SQLite file sits on a file system the test
controls, fed `test.record` jobs whose payloads are as large as the API allows
(just under 256 KiB), so each Enqueue needs fresh disk space:

- disk full: a 4 MiB tmpfs the test mounts. Enqueues go on until five in a row
  are refused; while the disk is full, Get, List and a WatchEvents replay must
  still answer. Then the tmpfs is grown (`mount -o remount,size=64m`, what an
  operator extending a volume does) and the same process, never restarted, must
  accept Enqueues again, run every job and leave a sound file holding exactly the
  acknowledged jobs.
- file-size limit: the same, with the database on the ordinary disk and the
  server held under RLIMIT_FSIZE (set on the running process with
  `resource.prlimit`), which makes SQLite's writes past the limit fail with
  EFBIG. CPython ignores SIGXFSZ at start-up (the test checks the process's
  ignored-signal mask), so the write fails instead of the signal killing the
  process. Raising the limit again is the recovery, again without a restart.
- read-only: Linux refuses to remount a file system read-only while any file on
  it is open for writing (`mount -o remount,ro` fails with EBUSY on tmpfs and
  ext4 alike, and a read-only bind mount is refused the same way), and a running
  server always holds its database open read-write, so "remount,ro under a live
  server" cannot be staged with the mount API. What does turn a mounted file
  system read-only under open files in production is an error remount: ext4
  with `errors=remount-ro` after it detects corruption or an I/O error. The test
  stages exactly that on a loop-mounted ext4 image (`/sys/fs/ext4/<dev>/
  trigger_fs_error`). Such a file system cannot be made writable again while
  mounted (the kernel accepts `remount,rw` but keeps it read-only, because its
  journal is aborted): an operator unmounts it, runs e2fsck and mounts it again,
  so the recovery here is by restart, and the experiment checks that the
  restarted server finds every acknowledged job and runs them all.

Figures per variant: acknowledged jobs, rejected writes by status, the slowest
rejected write, and the recovery time (space back to the first accepted Enqueue;
for the read-only variant, restart to every job finished).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2
from tests.reliability.conftest import Figures
from tests.reliability.process_helpers import attempt_history, event_logs, integrity_check, job_rows
from tests.support import require, sqlite_url
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import EXIT_SECONDS, TEST_HANDLERS, Client, Leasehold, sqlite_path, wait_until

pytestmark = pytest.mark.slow

# As large as the API accepts: the payload's JSON must stay within 256 KiB.
BLOB = "x" * (256 * 1024 - 128)
# Refusals in a row after which the disk counts as full.
REFUSALS_IN_A_ROW = 5
MAX_FILL_CALLS = 80
# "Fail fast": no refused write may take longer than this (generous: 2 noisy cores).
REJECTION_BOUND_SECONDS = 5.0
RECOVERY_BOUND_SECONDS = 15.0
ACCEPTED_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})
SERVE_FLAGS = ("--lease-seconds", "6", "--concurrency", "2", "--handlers", *TEST_HANDLERS)


# ----- the machine's side: mounts, limits ------------------------------------------------------


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def unmount(directory: Path) -> None:
    """Unmount, lazily when something still holds it (a test that failed midway),
    so no mount outlives the test."""
    if run("umount", str(directory)).returncode != 0:
        run("umount", "--lazy", str(directory))


@contextlib.contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    mounted = run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(directory))
    assert mounted.returncode == 0, mounted.stderr
    try:
        yield directory
    finally:
        unmount(directory)


def tmpfs_mountable(scratch: Path) -> bool:
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return False
    probe = scratch / "tmpfs-probe"
    probe.mkdir(parents=True, exist_ok=True)
    if run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)).returncode != 0:
        return False
    unmount(probe)
    return True


@contextlib.contextmanager
def ext4_image(image: Path, directory: Path) -> Iterator[Path]:
    """Mount `image` (made by `make_ext4_image`) on `directory` through a loop
    device, with `errors=remount-ro`; yields the loop device's sysfs directory."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = run("mount", "-o", "loop,errors=remount-ro", str(image), str(directory))
    assert mounted.returncode == 0, mounted.stderr
    try:
        device = run("findmnt", "-n", "-o", "SOURCE", str(directory)).stdout.strip()
        yield Path("/sys/fs/ext4") / Path(device).name
    finally:
        unmount(directory)


def make_ext4_image(image: Path, size_mb: int) -> None:
    with image.open("wb") as handle:
        handle.truncate(size_mb * 1024 * 1024)
    made = run("mkfs.ext4", "-q", "-F", str(image))
    assert made.returncode == 0, made.stderr


def ext4_error_remount_available(scratch: Path) -> bool:
    """Loop devices, mkfs.ext4 and ext4's `trigger_fs_error` all present."""
    if shutil.which("mkfs.ext4") is None or shutil.which("findmnt") is None:
        return False
    image, directory = scratch / "ext4-probe.img", scratch / "ext4-probe"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        make_ext4_image(image, 8)
    except AssertionError:
        return False
    try:
        if run("mount", "-o", "loop", str(image), str(directory)).returncode != 0:
            return False
        device = run("findmnt", "-n", "-o", "SOURCE", str(directory)).stdout.strip()
        available = (Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error").exists()
        unmount(directory)
        return available
    finally:
        image.unlink()


def is_read_only(directory: Path) -> bool:
    try:
        fd = os.open(directory / "write-probe", os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        return exc.errno == errno.EROFS
    os.close(fd)
    os.unlink(directory / "write-probe")
    return False


def ignores_signal(pid: int, signum: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError(f"no SigIgn line for process {pid}")


# ----- the service's side --------------------------------------------------------------------------


@contextlib.contextmanager
def serving(database_url: str, records: Path) -> Iterator[Leasehold]:
    """A `leasehold serve` on `database_url`, SIGKILLed on the way out if it is
    still alive, so a mount it sits on can be unmounted after it."""
    records.mkdir(parents=True, exist_ok=True)
    server = Leasehold.serve(database_url, *SERVE_FLAGS, env={RECORD_DIR_ENV: str(records)})
    try:
        server.start()
        yield server
    finally:
        server.kill()


@dataclass
class Writes:
    """What a run of Enqueues got back."""

    acknowledged: list[str] = field(default_factory=list)
    refused: list[tuple[grpc.StatusCode, str, float]] = field(default_factory=list)
    # How many were acknowledged before the first refusal.
    before_fault: int = 0

    def by_status(self) -> dict[str, int]:
        return dict(Counter(code.name for code, _, _ in self.refused))

    def slowest_refusal(self) -> float:
        return max(seconds for _, _, seconds in self.refused)


def enqueue_blob(client: Client, writes: Writes) -> bool:
    """One Enqueue of a maximal payload; True when it was acknowledged."""
    began = time.monotonic()
    try:
        job = client.enqueue("test.record", {"seconds": 0.01, "blob": BLOB})
    except grpc.RpcError as exc:
        writes.refused.append((exc.code(), exc.details() or "", time.monotonic() - began))
        return False
    writes.acknowledged.append(job.id)
    return True


def fill_until_refused(client: Client, writes: Writes) -> None:
    in_a_row = 0
    for _ in range(MAX_FILL_CALLS):
        in_a_row = 0 if enqueue_blob(client, writes) else in_a_row + 1
        if in_a_row == 1 and len(writes.refused) == 1:
            writes.before_fault = len(writes.acknowledged)
        if in_a_row == REFUSALS_IN_A_ROW:
            return
    raise AssertionError(f"no run of {REFUSALS_IN_A_ROW} refusals in {MAX_FILL_CALLS} Enqueues: {writes}")


def assert_refusals_are_clear(writes: Writes) -> None:
    """Each refusal: a retryable storage status (never INTERNAL/UNKNOWN or a
    deadline), a message naming the database, and fast."""
    assert writes.refused, "no write was refused"
    for code, details, seconds in writes.refused:
        assert code in ACCEPTED_CODES, (code, details)
        assert "database" in details.lower() and "internal" not in details.lower(), details
        assert seconds < REJECTION_BOUND_SECONDS, f"a refused write took {seconds:.2f}s: {details}"


def assert_reads_still_work(client: Client, acknowledged: list[str]) -> None:
    for job_id in acknowledged:
        assert client.get(job_id).id == job_id
    assert {job.id for job in client.list_all()} == set(acknowledged)
    # A replay from the start: the log's first event comes back.
    first = client.events_until(acknowledged[-1], lambda event: True, timeout=10)
    assert [(e.sequence, e.type) for e in first] == [(1, "job.queued")]


def recover(client: Client, writes: Writes) -> float:
    """Seconds from now until an Enqueue is accepted again."""
    began = time.monotonic()
    wait_until(lambda: enqueue_blob(client, writes), RECOVERY_BOUND_SECONDS, "an Enqueue to be accepted")
    return time.monotonic() - began


def assert_all_succeed(client: Client, job_ids: list[str], timeout: float = 60.0) -> None:
    for job_id in job_ids:
        assert client.wait_terminal(job_id, timeout).status == jobs_pb2.JOB_STATUS_SUCCEEDED, job_id


def assert_file_holds_exactly(url: str, acknowledged: list[str]) -> None:
    """Sound file; the acknowledged jobs and nothing else (a refused Enqueue left
    no trace); every log gap-free with one closing event per attempt."""
    assert integrity_check(sqlite_path(url)) == "ok"
    assert set(job_rows(url)) == set(acknowledged)
    for job_id, events in event_logs(url).items():
        attempt_history(job_id, events)


def report(figures: Figures, writes: Writes, recovery_seconds: float) -> None:
    figures("acknowledged before the fault", writes.before_fault)
    figures("acknowledged jobs in all", len(writes.acknowledged))
    figures("refused writes by status", writes.by_status())
    figures("slowest refused write s", writes.slowest_refusal())
    figures("refusal messages", sorted({details for _, details, _ in writes.refused}))
    figures("recovery s", recovery_seconds)


# ----- the experiments --------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_full_disk_refuses_writes_fast_and_recovers_without_a_restart(
    tmp_path: Path, figures: Figures
) -> None:
    require(tmpfs_mountable(tmp_path), "mounting a tmpfs (root with CAP_SYS_ADMIN)")
    writes = Writes()
    with tmpfs(tmp_path / "disk", "4m") as disk:
        url = sqlite_url(disk)
        with serving(url, tmp_path / "records") as server, Client(server.port or 0) as client:
            fill_until_refused(client, writes)
            assert len(writes.acknowledged) >= 2, "the disk was full before anything was written"
            assert_refusals_are_clear(writes)
            assert any(code == grpc.StatusCode.RESOURCE_EXHAUSTED for code, _, _ in writes.refused)
            assert_reads_still_work(client, writes.acknowledged)
            assert server.returncode is None, server.output[-3000:]

            assert run("mount", "-o", "remount,size=64m", str(disk)).returncode == 0
            recovery_seconds = recover(client, writes)
            for _ in range(3):
                assert enqueue_blob(client, writes), writes.refused[-1]
            assert_all_succeed(client, writes.acknowledged)
            assert server.interrupt() < EXIT_SECONDS and server.returncode == 0
        assert_file_holds_exactly(url, writes.acknowledged)
    report(figures, writes, recovery_seconds)


@pytest.mark.timeout(90)
def test_a_file_size_limit_refuses_writes_and_raising_it_recovers_without_a_restart(
    tmp_path: Path, figures: Figures
) -> None:
    url = sqlite_url(tmp_path / "db")
    (tmp_path / "db").mkdir()
    writes = Writes()
    with serving(url, tmp_path / "records") as server, Client(server.port or 0) as client:
        assert server.process is not None
        pid = server.process.pid
        assert ignores_signal(pid, signal.SIGXFSZ), "SIGXFSZ would kill the server instead of failing a write"
        database = sqlite_path(url)
        largest = max(path.stat().st_size for path in database.parent.iterdir())
        # Room for a few jobs: each costs ~0.8 MB of WAL (SQLite rewrites the row,
        # payload and all, on insert, claim and completion).
        limit = largest + 3 * 1024 * 1024
        # Only the soft limit: raising a hard limit needs CAP_SYS_RESOURCE.
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            fill_until_refused(client, writes)
            assert len(writes.acknowledged) >= 2, "the limit refused the first write"
            assert_refusals_are_clear(writes)
            assert_reads_still_work(client, writes.acknowledged)
            assert server.returncode is None, server.output[-3000:]
        finally:
            if server.returncode is None:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        recovery_seconds = recover(client, writes)
        for _ in range(3):
            assert enqueue_blob(client, writes), writes.refused[-1]
        assert_all_succeed(client, writes.acknowledged)
        assert server.interrupt() < EXIT_SECONDS and server.returncode == 0
    assert_file_holds_exactly(url, writes.acknowledged)
    figures("file size limit bytes", limit)
    report(figures, writes, recovery_seconds)


@pytest.mark.timeout(100)
def test_a_database_gone_read_only_refuses_writes_serves_reads_and_survives(
    tmp_path: Path, figures: Figures
) -> None:
    require(
        ext4_error_remount_available(tmp_path),
        "an ext4 loop mount with /sys/fs/ext4/<dev>/trigger_fs_error (root, loop devices, e2fsprogs)",
    )
    image, mount_point = tmp_path / "ext4.img", tmp_path / "ext4"
    make_ext4_image(image, 64)
    url = sqlite_url(mount_point)
    writes = Writes()
    with ext4_image(image, mount_point) as device:
        with serving(url, tmp_path / "records") as server, Client(server.port or 0) as client:
            for _ in range(6):
                assert enqueue_blob(client, writes)
            assert_all_succeed(client, writes.acknowledged)
            # A job is running when the file system turns read-only.
            running = client.enqueue("test.record", {"seconds": 3}).id
            writes.acknowledged.append(running)
            client.events_until(running, lambda event: event.type == "job.started")
            writes.before_fault = len(writes.acknowledged)

            (device / "trigger_fs_error").write_text("leasehold read-only experiment\n")
            wait_until(lambda: is_read_only(mount_point), 10, "the file system to turn read-only")
            for _ in range(REFUSALS_IN_A_ROW):
                assert not enqueue_blob(client, writes), "an Enqueue was acknowledged on a read-only disk"
            began = time.monotonic()
            with pytest.raises(grpc.RpcError) as cancel:
                client.cancel(running)
            writes.refused.append(
                (cancel.value.code(), cancel.value.details() or "", time.monotonic() - began)
            )
            assert_refusals_are_clear(writes)
            assert_reads_still_work(client, writes.acknowledged)
            # The running job's handler returns; its outcome cannot be written. The
            # runtime gives up on it once its lease could have lapsed and carries on.
            wait_until(
                lambda: server.events_for("job.record_failed", running), 30, "the outcome write to fail"
            )
            assert client.get(running).status == jobs_pb2.JOB_STATUS_RUNNING
            assert server.returncode is None, server.output[-3000:]
            assert server.interrupt() < EXIT_SECONDS and server.returncode == 0, server.output[-3000:]

    # What an operator does: check the file system, mount it again, restart.
    checked = run("e2fsck", "-f", "-y", str(image))
    assert checked.returncode in (0, 1), checked.stdout + checked.stderr  # 1: errors fixed
    with ext4_image(image, mount_point):
        assert_file_holds_exactly(url, writes.acknowledged)
        restarted = time.monotonic()
        with serving(url, tmp_path / "records") as server, Client(server.port or 0) as client:
            assert_all_succeed(client, writes.acknowledged)
            recovery_seconds = time.monotonic() - restarted
            # The interrupted job ran again after its lease lapsed: attempt 2.
            assert client.get(running).attempt == 2
            assert server.interrupt() < EXIT_SECONDS and server.returncode == 0
        assert_file_holds_exactly(url, writes.acknowledged)
    report(figures, writes, recovery_seconds)

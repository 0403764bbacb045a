"""Soak: run one `leasehold serve` under sustained load and prove nothing leaks, grows or goes missing.

    python -m bench.soak [--seconds 600] [--concurrency 8] [--producers 16] [--watchers 100] ...

Promise under test: a server that has been busy for a long time behaves like a fresh one. Every
acknowledged Enqueue ends in a terminal job, every event log a subscriber reads is gap-free and
duplicate-free, and the process's memory and the SQLite write-ahead log stop growing once the
load is steady.

How: one `leasehold serve` subprocess on a fresh SQLite file in a temporary directory, with the
built-in example kinds and `--concurrency 8`, started through leasehold.testing.ServerProcess,
which reads its address from its `server.started` log line. For `--seconds`:

* producers (`--producers` concurrent grpc.aio loops) enqueue back to back: mostly
  `example.echo`, a quarter of them with a fresh resource id, one in 50 an `example.fail` with
  `times=1` (fails once, is retried after the 2 s backoff, then succeeds), and one in 23 a repeat
  of one of the producer's earlier resource ids, which must return that same job with
  `created = false`. Enqueue is cheaper than execution, so they pause while `--max-backlog`
  acknowledged jobs are unfinished: "full rate" is then the rate the server sustains, and the
  run measures a steady state rather than a queue that grows for as long as it lasts;
* watchers (`--watchers`, default 100) each pick one of the most recently acknowledged jobs,
  WatchEvents from sequence 0 until the server ends the stream after the terminal event, check
  the sequences are exactly 1..N, the terminal event is the last and only terminal event, and the
  event types are exactly what the kind produces (echo: queued, started, echo, succeeded; fail
  once: queued, started, retry_scheduled, started, succeeded), then pick another;
* a sampler reads the server's RSS (VmRSS in /proc/<pid>/status) and the size of the `-wal` file
  once a second.

Then producers stop, the bench waits (at most `--drain-seconds`) until no job is queued or
running, lists every job of the owner and checks each acknowledged one exists and succeeded,
stops the server with SIGINT and expects a clean exit. One JSON object goes to stdout; the exit
status is 1 when any check failed (the `reasons` say which).

Bounds (flags, so a slower machine can loosen them without editing code):

* `--max-rss-mb` (default 400): an absolute ceiling. The server starts near 75 MB; its working
  set is gRPC buffers, one SQLite page cache per connection (2 MB each, at most 21 connections)
  and a few thousand in-flight Python objects, so several hundred MB means something accumulates.
* RSS must plateau: the maximum over the last third of the run may exceed the maximum over the
  middle third by at most `--rss-growth-pct` percent (default 10) or `--rss-growth-floor-mb`
  (default 12 MB), whichever is larger. The first third is warm-up (allocator arenas, caches,
  connection pools filling); a leak proportional to the work done shows as steady growth between
  the middle and last thirds, while a plateau only wobbles. The floor keeps the allocator's
  ordinary jitter on a short run from reading as a leak.
* `--max-wal-mb` (default 16): SQLite checkpoints automatically once the WAL reaches 1000 pages
  (4 MB at the default page size) and then reuses the file from its start, so the WAL stays at a
  few MB plus one commit batch. It only grows past that when a reader holds an old snapshot open
  across checkpoints (checkpoint starvation), which is the defect this bound catches.
* `--drain-seconds` (default 120) bounds the wait for the backlog to finish after the producers
  stop; `--watch-timeout` (default 120) is the deadline of one WatchEvents call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import struct_pb2

from leasehold.testing import ServerProcess, serve_args
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[1]
METADATA = (("x-owner-id", "soak-owner"),)
EXPECTED_TYPES = {
    "example.echo": ("job.queued", "job.started", "echo", "job.succeeded"),
    "example.fail": ("job.queued", "job.started", "job.retry_scheduled", "job.started", "job.succeeded"),
}
UNFINISHED = (jobs_pb2.JOB_STATUS_QUEUED, jobs_pb2.JOB_STATUS_RUNNING)
TERMINAL_STATUSES = frozenset(
    {jobs_pb2.JOB_STATUS_SUCCEEDED, jobs_pb2.JOB_STATUS_FAILED, jobs_pb2.JOB_STATUS_CANCELLED}
)
RECENT_JOBS = 200  # watchers pick among this many most recent jobs, so most watches follow live
EXAMPLES = 5  # how many examples of each kind of problem the report keeps
# Runtime log records that mean "this job's last attempt is over" (used for pacing only).
_FINISHED_MARK, _FAILED_MARK, _FINAL_MARK = (
    '"event": "job.completed"',
    '"event": "job.failed"',
    '"final": true',
)


# ----- the server process ---------------------------------------------------------------------


class SoakServer(ServerProcess):
    """`leasehold serve` as a child process, through the harness the tests use too. It logs a few
    lines per job at info level and must never block on a full pipe: the harness's reader thread
    drains it, and this keeps only counts, warning and error records and (the harness's) tail."""

    def __init__(self, directory: Path, concurrency: int) -> None:
        self.database = directory / "soak.db"
        self.wal = directory / "soak.db-wal"
        self.on_finished: Callable[[], None] = lambda: None
        self.log_lines = 0
        self.warnings: Counter[str] = Counter()
        self.errors: list[str] = []
        env = {key: value for key, value in os.environ.items() if not key.startswith("LEASEHOLD_")}
        url = f"sqlite+aiosqlite:///{self.database}"
        flags = ("--concurrency", str(concurrency))
        super().__init__(serve_args(url, *flags), env=env, cwd=REPO_ROOT, on_line=self._line)

    def _line(self, line: str) -> None:
        self.log_lines += 1
        if _FINISHED_MARK in line or (_FAILED_MARK in line and _FINAL_MARK in line):
            self.on_finished()
        if '"level": "warning"' in line or '"level": "error"' in line:
            self._parse(line)

    def _parse(self, line: str) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return
        if not isinstance(record, dict):
            return
        if record.get("level") == "warning":
            self.warnings[str(record.get("event"))] += 1
        elif record.get("level") in ("error", "critical") and len(self.errors) < EXAMPLES:
            self.errors.append(line.strip())

    def tail(self) -> list[str]:
        return self.output_tail(10).splitlines()

    def rss_mb(self) -> float:
        """Resident set size, from VmRSS in /proc/<pid>/status."""
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS line")

    def cpu_seconds(self) -> float:
        """User plus system CPU time, from /proc/<pid>/stat."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wal_mb(self) -> float:
        try:
            return self.wal.stat().st_size / 2**20
        except FileNotFoundError:
            return 0.0

    def interrupt(self, timeout: float) -> tuple[int | None, float]:
        """SIGINT (Ctrl-C), then SIGKILL after `timeout`; the exit status (None if it had to be
        killed) and the seconds taken."""
        began = time.monotonic()
        code = self.stop(timeout, signal.SIGINT)
        return code, time.monotonic() - began


# ----- load ---------------------------------------------------------------------------------------


class Pacer:
    """Holds producers back while `limit` acknowledged jobs are still unfinished.

    Enqueue is cheaper than execution, so unpaced producers would grow the queue for as long as
    the run lasts and the soak would measure an ever longer backlog instead of a steady state.
    Completions are counted from the server's own `job.completed` log records (a signal for
    pacing only; what the report claims is checked through the API)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.enqueued = 0
        self.finished = 0
        self.paused_seconds = 0.0
        self._room = asyncio.Event()
        self._room.set()
        self._stopped = False

    def _full(self) -> bool:
        return not self._stopped and self.enqueued - self.finished >= self.limit

    async def admit(self) -> None:
        if not self._full():
            return
        began = time.monotonic()
        while self._full():
            self._room.clear()
            await self._room.wait()
        self.paused_seconds += time.monotonic() - began

    def acknowledged(self) -> None:
        self.enqueued += 1

    def finish(self) -> None:
        self.finished += 1
        if not self._full():
            self._room.set()

    def stop(self) -> None:
        self._stopped = True
        self._room.set()


@dataclass
class Tally:
    """Everything the load side observed."""

    acknowledged: dict[str, str] = field(default_factory=dict)  # job id -> kind
    recent: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=RECENT_JOBS))
    first_ack: asyncio.Event = field(default_factory=asyncio.Event)
    enqueue_calls: int = 0
    enqueue_errors: Counter[str] = field(default_factory=Counter)
    dedup_fresh: int = 0
    dedup_repeats: int = 0
    dedup_mismatches: list[str] = field(default_factory=list)
    logs_watched: int = 0
    events_checked: int = 0
    lost_events: int = 0
    duplicate_events: int = 0
    bad_logs: list[str] = field(default_factory=list)
    bad_log_count: int = 0
    watch_errors: Counter[str] = field(default_factory=Counter)


def _struct(payload: dict[str, Any]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(payload)
    return value


async def produce(
    index: int, stub: jobs_pb2_grpc.JobServiceStub, stop: asyncio.Event, pacer: Pacer, tally: Tally
) -> None:
    """Enqueue back to back (while the backlog allows) until `stop`. Resource ids exercise dedup:
    a fresh one must create a job, a repeated one must return the job it created."""
    resources: deque[tuple[str, str]] = deque(maxlen=100)  # (resource id, job id)
    n = 0
    while True:
        await pacer.admit()
        if stop.is_set():
            return
        n += 1
        repeat = resources[random.randrange(len(resources))] if n % 23 == 0 and resources else None
        if repeat is not None:
            request = _request("example.echo", {"p": index, "n": n}, resource_id=repeat[0])
        elif n % 50 == 0:
            request = _request("example.fail", {"message": "soak: fails once", "times": 1})
        elif n % 4 == 0:
            request = _request("example.echo", {"p": index, "n": n}, resource_id=f"p{index}-{n}")
        else:
            request = _request("example.echo", {"p": index, "n": n})
        tally.enqueue_calls += 1
        try:
            response = await stub.Enqueue(request, metadata=METADATA, timeout=30)
        except grpc.aio.AioRpcError as exc:
            tally.enqueue_errors[exc.code().name] += 1
            continue
        job = response.job
        if repeat is not None:
            tally.dedup_repeats += 1
            if response.created or job.id != repeat[1]:
                _keep(
                    tally.dedup_mismatches, f"{repeat[0]}: {repeat[1]} -> {job.id} created={response.created}"
                )
            continue
        if request.resource_id:
            tally.dedup_fresh += 1
            if not response.created:
                _keep(tally.dedup_mismatches, f"fresh {request.resource_id} returned created=false")
            resources.append((request.resource_id, job.id))
        tally.acknowledged[job.id] = request.kind
        pacer.acknowledged()
        tally.recent.append((job.id, request.kind))
        tally.first_ack.set()


def _request(kind: str, payload: dict[str, Any], resource_id: str = "") -> jobs_pb2.EnqueueRequest:
    return jobs_pb2.EnqueueRequest(
        kind=kind,
        payload=_struct(payload),
        resource_type="soak.document" if resource_id else "",
        resource_id=resource_id,
    )


def _keep(examples: list[str], example: str) -> None:
    if len(examples) < EXAMPLES:
        examples.append(example)


async def watch(
    stub: jobs_pb2_grpc.JobServiceStub, stop: asyncio.Event, tally: Tally, timeout: float
) -> None:
    """Watch recently acknowledged jobs, one whole log at a time, until `stop`."""
    await tally.first_ack.wait()
    while not stop.is_set():
        job_id, kind = tally.recent[random.randrange(len(tally.recent))]
        try:
            await _check_log(stub, job_id, kind, tally, timeout)
        except grpc.aio.AioRpcError as exc:
            tally.watch_errors[exc.code().name] += 1


async def _check_log(
    stub: jobs_pb2_grpc.JobServiceStub, job_id: str, kind: str, tally: Tally, timeout: float
) -> None:
    """Read the log from 0 to the end of the stream. Sequences must be exactly 1..N: a jump
    counts its missing sequences as lost, a repeat or step back counts as a duplicate."""
    call = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id), metadata=METADATA, timeout=timeout)
    expected = 1
    types: list[str] = []
    async for response in call:
        sequence = response.event.sequence
        tally.events_checked += 1
        if sequence < expected:
            tally.duplicate_events += 1
            continue
        tally.lost_events += sequence - expected
        expected = sequence + 1
        types.append(response.event.type)
    tally.logs_watched += 1
    if tuple(types) != EXPECTED_TYPES[kind]:
        tally.bad_log_count += 1
        _keep(tally.bad_logs, f"{job_id} ({kind}): {types}")


@dataclass
class Sample:
    at: float
    rss_mb: float
    wal_mb: float


async def sample(server: SoakServer, stop: asyncio.Event, samples: list[Sample]) -> None:
    """RSS and WAL size once a second (a periodic measurement, not a wait for a condition)."""
    began = time.monotonic()
    while not stop.is_set():
        samples.append(Sample(time.monotonic() - began, server.rss_mb(), server.wal_mb()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()


# ----- after the load -----------------------------------------------------------------------------


async def wait_drained(stub: jobs_pb2_grpc.JobServiceStub, timeout: float) -> float | None:
    """Seconds until no job of the owner is queued or running, or None after `timeout`."""
    began = time.monotonic()
    request = jobs_pb2.ListRequest(page_size=1, statuses=UNFINISHED)
    while time.monotonic() - began < timeout:
        response = await stub.List(request, metadata=METADATA, timeout=30)
        if not response.jobs:
            return time.monotonic() - began
        await asyncio.sleep(0.5)
    return None


async def all_statuses(stub: jobs_pb2_grpc.JobServiceStub) -> dict[str, int]:
    """Every job of the owner, id -> status, through List's pages."""
    statuses: dict[str, int] = {}
    token = ""
    while True:
        response = await stub.List(
            jobs_pb2.ListRequest(page_size=500, page_token=token), metadata=METADATA, timeout=60
        )
        statuses.update((job.id, job.status) for job in response.jobs)
        token = response.next_page_token
        if not token:
            return statuses


# ----- the run ------------------------------------------------------------------------------------


async def soak(options: argparse.Namespace, server: SoakServer) -> dict[str, Any]:
    address = (await asyncio.to_thread(server.wait_started, 60.0)).address
    tally = Tally()
    pacer = Pacer(options.max_backlog)
    loop = asyncio.get_running_loop()

    def finished() -> None:  # runs on the stderr thread
        loop.call_soon_threadsafe(pacer.finish)

    server.on_finished = finished
    samples: list[Sample] = []
    stop_load, stop_sampling = asyncio.Event(), asyncio.Event()
    report: dict[str, Any] = {"seconds": options.seconds}
    async with (
        grpc.aio.insecure_channel(address) as producer_channel,
        grpc.aio.insecure_channel(address) as watcher_channel,
    ):
        producer_stub = jobs_pb2_grpc.JobServiceStub(producer_channel)
        watcher_stub = jobs_pb2_grpc.JobServiceStub(watcher_channel)
        sampler = asyncio.create_task(sample(server, stop_sampling, samples))
        began, server_cpu, own_cpu = time.monotonic(), server.cpu_seconds(), time.process_time()
        producers = [
            asyncio.create_task(produce(i, producer_stub, stop_load, pacer, tally))
            for i in range(options.producers)
        ]
        watchers = [
            asyncio.create_task(watch(watcher_stub, stop_load, tally, options.watch_timeout))
            for _ in range(options.watchers)
        ]
        await asyncio.sleep(options.seconds)  # the length of the run itself
        stop_load.set()
        pacer.stop()
        await asyncio.gather(*producers)
        load_seconds = time.monotonic() - began
        server_cpu, own_cpu = server.cpu_seconds() - server_cpu, time.process_time() - own_cpu
        stop_sampling.set()
        await sampler
        tally.first_ack.set()  # a watcher still waiting for the first job sees stop and leaves

        drained = await wait_drained(producer_stub, options.drain_seconds)
        unfinished = await _join(watchers, options.watch_timeout + 10)
        statuses = await all_statuses(producer_stub)
        end = Sample(time.monotonic() - began, server.rss_mb(), server.wal_mb())
    server.on_finished = lambda: None
    exit_code, stop_seconds = server.interrupt(30.0)

    report.update(_load_figures(tally, load_seconds, statuses, drained, unfinished))
    report["producers_paused_share"] = round(pacer.paused_seconds / options.producers / load_seconds, 2)
    # CPU use during the load, in cores (1.0 = one core busy all the time): the machine has few.
    report["server_cpu_cores"] = round(server_cpu / load_seconds, 2)
    report["bench_cpu_cores"] = round(own_cpu / load_seconds, 2)
    # The server's CPU per acknowledged job: comparable across runs on a machine shared with others.
    report["server_cpu_ms_per_job"] = round(1000 * server_cpu / max(1, len(tally.acknowledged)), 1)
    report.update(_resource_figures(samples, end, server))
    report.update(
        server_exit_code=exit_code,
        server_stop_seconds=round(stop_seconds, 2),
        server_log_lines=server.log_lines,
        server_warnings=dict(server.warnings),
        server_errors=server.errors,
    )
    report["reasons"] = _verdict(report, tally, options)
    report["pass"] = not report["reasons"]
    if not report["pass"]:
        report["server_log_tail"] = server.tail()
    return report


async def _join(tasks: list[asyncio.Task[None]], timeout: float) -> int:
    """Wait for `tasks`; cancel what is left after `timeout` and return how many that was. A task
    that raised is a bug in this bench, and its exception propagates."""
    if not tasks:
        return 0
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    for task in done:
        task.result()
    return len(pending)


def _load_figures(
    tally: Tally,
    load_seconds: float,
    statuses: dict[str, int],
    drained: float | None,
    unfinished_watchers: int,
) -> dict[str, Any]:
    missing = [job_id for job_id in tally.acknowledged if job_id not in statuses]
    terminal = sum(1 for job_id in tally.acknowledged if statuses.get(job_id) in TERMINAL_STATUSES)
    succeeded = sum(
        1 for job_id in tally.acknowledged if statuses.get(job_id) == jobs_pb2.JOB_STATUS_SUCCEEDED
    )
    by_status = Counter(jobs_pb2.JobStatus.Name(status) for status in statuses.values())
    return {
        "load_seconds": round(load_seconds, 1),
        "jobs_acknowledged": len(tally.acknowledged),
        "jobs_terminal": terminal,
        "jobs_succeeded": succeeded,
        "jobs_missing": len(missing),
        "jobs_missing_examples": missing[:EXAMPLES],
        "jobs_listed_by_status": dict(by_status),
        "enqueue_calls": tally.enqueue_calls,
        "enqueue_rate": round(len(tally.acknowledged) / load_seconds, 1),
        "enqueue_errors": dict(tally.enqueue_errors),
        "dedup_fresh_resources": tally.dedup_fresh,
        "dedup_repeats": tally.dedup_repeats,
        "dedup_mismatches": tally.dedup_mismatches,
        "drain_seconds": None if drained is None else round(drained, 1),
        "logs_watched": tally.logs_watched,
        "events_checked": tally.events_checked,
        "lost_events": tally.lost_events,
        "duplicate_events": tally.duplicate_events,
        "unexpected_logs": tally.bad_log_count,
        "unexpected_log_examples": tally.bad_logs,
        "watch_errors": dict(tally.watch_errors),
        "watchers_unfinished": unfinished_watchers,
    }


def _resource_figures(samples: list[Sample], end: Sample, server: SoakServer) -> dict[str, Any]:
    rss = [s.rss_mb for s in samples] or [end.rss_mb]
    wal = [s.wal_mb for s in samples] or [end.wal_mb]
    third = len(rss) // 3
    middle, last = rss[third : 2 * third] or rss, rss[2 * third :] or rss
    return {
        "samples": len(samples),
        "rss_mb_start": round(rss[0], 1),
        "rss_mb_median": round(statistics.median(rss), 1),
        "rss_mb_max": round(max(rss), 1),
        "rss_mb_middle_third_max": round(max(middle), 1),
        "rss_mb_last_third_max": round(max(last), 1),
        "rss_mb_end": round(end.rss_mb, 1),
        "wal_mb_max": round(max(wal), 2),
        "wal_mb_end": round(end.wal_mb, 2),
        "db_mb_end": round(server.database.stat().st_size / 2**20, 1),
    }


def _verdict(report: dict[str, Any], tally: Tally, options: argparse.Namespace) -> list[str]:
    """Every failed check, in words."""
    reasons: list[str] = []

    def check(ok: bool, reason: str) -> None:
        if not ok:
            reasons.append(reason)

    acknowledged = report["jobs_acknowledged"]
    check(acknowledged > 0, "no job was acknowledged")
    check(report["drain_seconds"] is not None, f"backlog not drained within {options.drain_seconds:g}s")
    check(report["jobs_missing"] == 0, f"{report['jobs_missing']} acknowledged jobs are missing")
    check(
        report["jobs_terminal"] == acknowledged, f"{acknowledged - report['jobs_terminal']} jobs not terminal"
    )
    check(report["jobs_succeeded"] == report["jobs_terminal"], "some terminal jobs did not succeed")
    check(not report["enqueue_errors"], f"enqueue errors {report['enqueue_errors']}")
    check(not report["dedup_mismatches"], f"dedup mismatches {report['dedup_mismatches']}")
    check(report["logs_watched"] > 0, "no event log was watched")
    check(report["lost_events"] == 0, f"{report['lost_events']} events lost")
    check(report["duplicate_events"] == 0, f"{report['duplicate_events']} duplicate events")
    check(report["unexpected_logs"] == 0, f"{report['unexpected_logs']} logs with unexpected events")
    check(not report["watch_errors"], f"watch errors {report['watch_errors']}")
    check(report["watchers_unfinished"] == 0, f"{report['watchers_unfinished']} watchers did not finish")
    check(
        report["rss_mb_max"] <= options.max_rss_mb, f"RSS {report['rss_mb_max']} MB > {options.max_rss_mb} MB"
    )
    allowed = max(
        report["rss_mb_middle_third_max"] * options.rss_growth_pct / 100, options.rss_growth_floor_mb
    )
    growth = report["rss_mb_last_third_max"] - report["rss_mb_middle_third_max"]
    check(
        growth <= allowed,
        f"RSS still growing: last third +{growth:.1f} MB over middle (allowed {allowed:.1f})",
    )
    check(
        report["wal_mb_max"] <= options.max_wal_mb, f"WAL {report['wal_mb_max']} MB > {options.max_wal_mb} MB"
    )
    check(report["server_exit_code"] == 0, f"server exit status {report['server_exit_code']} after SIGINT")
    check(not report["server_errors"], "server logged errors")
    return reasons


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--seconds", type=float, default=600.0, help="length of the load phase (default 600)")
    add("--concurrency", type=int, default=8, help="the server's execution slots (default 8)")
    add("--producers", type=int, default=16, help="concurrent Enqueue loops (default 16)")
    add("--watchers", type=int, default=100, help="concurrent WatchEvents loops (default 100)")
    add("--max-backlog", type=int, default=300, help="unfinished jobs before producers wait (default 300)")
    add("--max-rss-mb", type=float, default=400.0, help="RSS ceiling (default 400)")
    add("--rss-growth-pct", type=float, default=10.0, help="allowed last-vs-middle third growth (default 10)")
    add("--rss-growth-floor-mb", type=float, default=12.0, help="allowed growth at least this (default 12)")
    add("--max-wal-mb", type=float, default=16.0, help="WAL file ceiling (default 16)")
    add("--drain-seconds", type=float, default=120.0, help="bound on the post-load drain (default 120)")
    add("--watch-timeout", type=float, default=120.0, help="deadline of one WatchEvents call (default 120)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="leasehold-soak-") as directory:
        server = SoakServer(Path(directory), options.concurrency)
        try:
            report = asyncio.run(soak(options, server))
        except Exception as exc:  # report the crash as JSON like any other failure
            report = {"seconds": options.seconds, "pass": False, "reasons": [f"soak crashed: {exc!r}"]}
            report["server_log_tail"] = server.tail()
        finally:
            server.kill()
    print(json.dumps(report, indent=2))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

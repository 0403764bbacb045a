"""Experiment 3 — concurrent claimers with stalled processes.

Promise (DESIGN §3 "Lease token fencing", docs/jobs.md "Leases and delivery semantics"):
several `leasehold serve` processes may share one database (a SQLite file, or PostgreSQL
as replicas); a job never runs under two valid leases, a worker that stalls past
its lease loses the job to another one, and when it wakes up nothing it writes
is accepted — its completion is rejected and logged as `job.lease_lost`. Every
job still ends succeeded, exactly once as far as the state goes (execution
itself is at least once).

How, on each engine: PROCESSES servers (4 slots each, 6 s lease, 50 ms poll)
claim JOBS `test.record` jobs from one database. During a first wave of
FIRST_WAVE jobs (two of LONG_SECONDS, the rest 0.5–1.5 s) two of the servers are
frozen with SIGSTOP for PAUSE_SECONDS (longer than the lease), staggered, each
while all its slots are busy (the first while it runs a long job) and while it
is not inside a write transaction (SQLite's write lock, or a PostgreSQL
transaction that may hold row locks; see `freeze_outside_write_lock`). Their
leases lapse, the server still awake requeues and reruns those jobs, and the
frozen handlers, thawed with SIGCONT, carry on late: the short ones return, the
long one is still running and learns from its heartbeat that its lease is gone.
A second wave of short jobs (0.1–0.5 s) then keeps all three claiming. The
`faults` variant loads `tests.reliability.faults` into every process so 5 % of
COMMITs fail (seeded per process); the guarantees must hold all the same.

What would catch a claim that hands a job to two workers:
- the event-log parse (`attempt_history`): a second `job.started` before the
  first attempt's closing event, or attempts that do not count up by one;
- the `job.started` log records of all processes: one (job, attempt) claimed by
  two processes, or a claim missing from the event log;
- a `job.lease_expired` for an attempt whose holder was neither frozen during it
  nor failing to write: a lease taken from a live worker looks like any other
  expiry in the log, so each one must be explained;
- the record files: one (job, attempt) executed twice, or an execution whose
  attempt closed as anything but its own success or `job.lease_expired`;
- the `job.completed` log records: more than one accepted completion per job.
A stale completion that slipped through fencing shows as a `job.completed` for
an attempt the log closed with `job.lease_expired`, or as a second terminal
event (checked by breaking the token check on a private copy: caught). Last, every
attempt a process claimed must end in its own log (`job.completed`,
`job.lease_lost`, ...): a lost lease is logged (DESIGN §3).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy.engine import make_url

from leasehold.v1 import jobs_pb2
from tests import database_reads
from tests.reliability.conftest import Figures
from tests.reliability.faults import RATE_ENV, SEED_ENV
from tests.reliability.process_helpers import (
    Attempt,
    attempt_history,
    consistency_problems,
    event_logs,
    is_postgres,
    job_rows,
    storage_check,
)
from tests.support import require
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import (
    EXIT_SECONDS,
    TERMINAL,
    TEST_HANDLERS,
    Client,
    Leasehold,
    assert_gap_free,
    event_payload,
    iter_records,
    run_cli,
    sqlite_path,
    struct,
    wait_until,
)

PROCESSES = 3
CONCURRENCY = 4
JOBS = 200
FIRST_WAVE = 24
LEASE_SECONDS = 6
PAUSE_SECONDS = 8.5  # longer than the lease, so every lease of a frozen process lapses
LONG_JOBS = 2
LONG_SECONDS = 12.0  # outlasts a freeze, so its handler is still running when thawed
SEED = 31_337
# Every lost lease (a freeze, or a completion whose COMMIT was failed by an injected
# fault) costs the job an attempt, and the default of 3 could end a job `failed`
# after three unlucky attempts; 10 leaves headroom so that "every job succeeds" tests
# fencing and recovery, not the odds of the fault dice.
MAX_ATTEMPTS = 10

# Log records with which an executor ends its handling of a claimed attempt.
ATTEMPT_END_LOGS = frozenset(
    {
        "job.completed",
        "job.failed",
        "job.cancelled",
        "job.lease_lost",
        "job.record_failed",
        "job.released",
    }
)


# Log records of a worker that could not write for an attempt (its lease may lapse).
STORAGE_TROUBLE_LOGS = frozenset({"job.heartbeat_failed", "job.write_retrying", "job.record_failed"})


def enqueue_all(clients: list[Client], sleeps: list[float], first: int) -> list[str]:
    """Enqueue job first+i with resource key `claimers/job-<first+i>`, spread over the processes
    and all in flight at once (group commit batches them). Calls refused with
    UNAVAILABLE (an injected COMMIT fault) are repeated; the resource key makes a
    repeat idempotent, so the set of jobs is exact either way."""

    def request(index: int) -> jobs_pb2.EnqueueRequest:
        return jobs_pb2.EnqueueRequest(
            kind="test.record",
            payload=struct({"seconds": sleeps[index]}),
            resource_type="claimers",
            resource_id=f"job-{first + index}",
            max_attempts=MAX_ATTEMPTS,
        )

    def call(index: int) -> Any:
        client = clients[index % len(clients)]
        return client.stub.Enqueue.future(request(index), metadata=client.metadata, timeout=30)

    pending = {index: call(index) for index in range(len(sleeps))}
    ids: dict[int, str] = {}
    for _ in range(20):
        for index, future in list(pending.items()):
            try:
                ids[index] = future.result().job.id
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                continue
            del pending[index]
        if not pending:
            return [ids[index] for index in range(len(sleeps))]
        pending = {index: call(index) for index in pending}
    raise AssertionError(f"enqueue kept failing for {sorted(pending)}")


def unfinished_attempts(process: Leasehold) -> set[tuple[str, int]]:
    """Attempts this process logged as started but not yet as ended."""
    started = {(r["job_id"], r["attempt"]) for r in process.events("job.started")}
    ended = {
        (r["job_id"], r.get("attempt")) for r in list(process.records) if r.get("event") in ATTEMPT_END_LOGS
    }
    return started - ended


def holds_write_lock(pid: int, shm_path: Path) -> bool:
    """Whether `pid` holds SQLite's WAL write lock: an fcntl WRITE lock on byte 120
    of the `-shm` file, held from BEGIN IMMEDIATE to COMMIT."""
    inode = os.stat(shm_path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 8:
            continue  # a waiter, not a holder
        kind, owner, file_id, start = fields[3], fields[4], fields[5], fields[6]
        if kind == "WRITE" and owner == str(pid) and file_id.endswith(f":{inode}") and start == "120":
            return True
    return False


def in_transaction(database_url: str, application_name: str) -> bool:
    """Whether a PostgreSQL session of the process whose URL names it
    `application_name` is doing anything but waiting idle outside a transaction
    (an open write transaction holds row locks until it commits). Asked twice,
    50 ms apart: a statement the process sent just before it was frozen (its
    BEGIN, say) is carried out by then."""
    statement = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = :name AND state <> 'idle'"
    )
    for look in range(2):
        if look:
            time.sleep(0.05)
        if database_reads.scalar(database_url, statement, name=application_name) > 0:
            return True
    return False


def sessions_of(database_url: str, application_name: str) -> int:
    """How many PostgreSQL sessions the process named `application_name` has open."""
    statement = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = :name"
    )
    return int(database_reads.scalar(database_url, statement, name=application_name))


def with_application_name(database_url: str, name: str) -> str:
    """The PostgreSQL URL with `application_name` set, so the test can tell one
    process's sessions from another's in pg_stat_activity."""
    return (
        make_url(database_url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def freeze_outside_write_lock(pid: int, writing: Callable[[], bool]) -> int:
    """SIGSTOP `pid` at a moment it is not inside a write transaction (`writing()`
    says whether it is); returns how many freezes landed inside one and were
    undone first. A process frozen with SQLite's write lock stalls every process on
    the file (their writes time out, all leases lapse at once); one frozen inside a
    PostgreSQL transaction stalls every write that needs a row it locked (with no
    lock timeout, for as long as the freeze). That is another experiment, and this
    one, whose point is a stalled claimer racing live ones, would prove less with
    it."""
    for retries in range(100):
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: stopped(pid), timeout=5, what=f"process {pid} to stop", interval=0.001)
        if not writing():
            return retries
        os.kill(pid, signal.SIGCONT)
        # Let it run on to its COMMIT: there is no condition to poll from outside
        # short of the lock itself, which is exactly what is checked next time.
        time.sleep(0.02)
    raise AssertionError(f"process {pid} was writing at every one of 100 freezes")


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("fault_rate", [0.0, 0.05], ids=["clean", "faults"])
def test_stalled_claimers_never_share_a_valid_lease(
    tmp_path: Path, database_url: str, figures: Figures, fault_rate: float
) -> None:
    postgres = is_postgres(database_url)
    if not postgres:
        require(Path("/proc/locks").is_file(), "/proc/locks, to freeze a process outside SQLite's write lock")
    rng = random.Random(SEED)
    records_dir = tmp_path / "records"
    records_dir.mkdir()
    url = database_url
    migrated = run_cli("migrate", "--database-url", url)
    assert migrated.returncode == 0, migrated.stderr

    handlers = [*TEST_HANDLERS, *(["tests.reliability.faults"] if fault_rate else [])]
    flags = (
        "--concurrency",
        str(CONCURRENCY),
        "--lease-seconds",
        str(LEASE_SECONDS),
        "--poll-seconds",
        "0.05",
    )
    servers: list[Leasehold] = []
    writing: list[Callable[[], bool]] = []  # per process: is it inside a write transaction?
    for index in range(PROCESSES):
        env = {RECORD_DIR_ENV: str(records_dir)}
        if fault_rate:
            env |= {RATE_ENV: str(fault_rate), SEED_ENV: str(SEED + index)}
        own_url = url
        if postgres:
            name = f"claimer-{index}"
            own_url = with_application_name(url, name)
            writing.append(functools.partial(in_transaction, url, name))
        servers.append(Leasehold.serve(own_url, *flags, "--handlers", *handlers, env=env))
    paused: list[int] = []  # the processes frozen, in order
    freeze_retries = 0
    freeze_walls: dict[int, tuple[float, float]] = {}  # frozen from, to (wall clock)
    frozen_at: dict[int, float] = {}  # those frozen right now, since when (monotonic)
    pids: list[int] = []
    try:
        for server in servers:
            server.launch()
        clients = [Client(server.wait_started()) for server in servers]
        pids.extend(server.process.pid for server in servers if server.process is not None)
        if postgres:
            # The freeze check sees each process's sessions by name (else it
            # would find every process idle, always). A process is up before its
            # listener has connected, so its first session may be a moment behind.
            for index in range(PROCESSES):
                wait_until(
                    lambda index=index: sessions_of(url, f"claimer-{index}") > 0,
                    timeout=10,
                    what=f"a session named claimer-{index}",
                )
        else:
            shm_path = Path(f"{sqlite_path(url)}-shm")
            writing.extend(functools.partial(holds_write_lock, pid, shm_path) for pid in pids)
        # Wave 1: LONG_JOBS jobs that outlast a freeze, enqueued first so they are
        # claimed first, then a few 0.5-1.5 s ones; every slot is busy when a process
        # is frozen, and the queue runs dry while it is frozen, so its lapsed jobs are
        # rerun at once by the process still awake while the frozen handlers still
        # "run". A frozen short handler finds its lease gone when it returns; a frozen
        # long one is still running when thawed and learns it from its heartbeat.
        long_ids = set(enqueue_all(clients, [LONG_SECONDS] * LONG_JOBS, 0))
        first_wave = [round(rng.uniform(0.5, 1.5), 3) for _ in range(FIRST_WAVE - LONG_JOBS)]
        ids = [*long_ids, *enqueue_all(clients, first_wave, LONG_JOBS)]

        # ----- freeze two claimers, each while its slots are full, for longer than a lease ---
        def ready_to_freeze(need_long: bool) -> list[int]:
            """Processes not frozen yet with every slot busy (and, if asked, running
            one of the long jobs)."""
            found = []
            for index, server in enumerate(servers):
                running = unfinished_attempts(server)
                if index in paused or len(running) < CONCURRENCY:
                    continue
                if need_long and not any(job_id in long_ids for job_id, _ in running):
                    continue
                found.append(index)
            return found

        for need_long in (True, False):
            index = wait_until(
                lambda need_long=need_long: ready_to_freeze(need_long),
                timeout=20,
                what="a process with every slot busy" + (" and a long job" if need_long else ""),
                interval=0.01,
            )[0]
            freeze_retries += freeze_outside_write_lock(pids[index], writing[index])
            paused.append(index)
            frozen_at[index] = time.monotonic()
            freeze_walls[index] = (time.time(), float("inf"))
            if need_long:
                time.sleep(rng.uniform(0.5, 1.0))  # stagger the freezes
        for index in paused:
            # The length of a freeze is the experiment's input, not a condition to poll.
            time.sleep(max(0.0, frozen_at[index] + PAUSE_SECONDS - time.monotonic()))
            os.kill(pids[index], signal.SIGCONT)
            del frozen_at[index]
            freeze_walls[index] = (freeze_walls[index][0], time.time())
        awake = next(index for index in range(PROCESSES) if index not in paused)
        client = clients[awake]  # serves the calls below; never frozen

        # Wave 2: many short jobs for all of them, the thawed ones included.
        second_wave = [round(rng.uniform(0.1, 0.5), 3) for _ in range(JOBS - FIRST_WAVE)]
        ids += enqueue_all(clients, second_wave, FIRST_WAVE)
        for index, other in enumerate(clients):
            if index != awake:
                other.close()

        # ----- let everything finish, including the thawed handlers' late endings ----------
        def settled() -> list[jobs_pb2.Job] | None:
            listed = client.list_all(kind="test.record")
            return listed if len(listed) == JOBS and all(job.status in TERMINAL for job in listed) else None

        listed = wait_until(settled, timeout=60, what=f"all {JOBS} jobs to finish")
        # A thawed handler needs at most its remaining sleep, a heartbeat period and a
        # lease's worth of write retries to end. An attempt that never logs its end
        # is recorded here and reported at the very end, after every other check.
        with contextlib.suppress(AssertionError):
            wait_until(
                lambda: all(not unfinished_attempts(server) for server in servers),
                timeout=20,
                what="every claimed attempt to end in its process",
            )
        silent: dict[int, set[tuple[str, int]]] = {
            i: open_ for i, server in enumerate(servers) if (open_ := unfinished_attempts(server))
        }
        got = {job_id: client.get(job_id) for job_id in ids}
        watched = {job_id: client.all_events(job_id, timeout=10) for job_id in ids}
        client.close()
        for server in servers:
            assert server.interrupt() < EXIT_SECONDS and server.returncode == 0, server.output[-2000:]
    finally:
        for index in frozen_at:
            os.kill(pids[index], signal.SIGCONT)
        for index, server in enumerate(servers):
            server.kill()
            # Kept for a post-mortem (pytest keeps the last runs' tmp_path).
            (tmp_path / f"server-{index}.log").write_text(server.output)

    # ----- state: every job succeeded, and List, Get, the database and the API logs agree ---
    assert storage_check(url) == "ok"
    rows = job_rows(url)
    logs = event_logs(url)
    assert consistency_problems(rows, logs) == []
    assert sorted(job.id for job in listed) == sorted(ids) == sorted(rows)
    histories: dict[str, list[Attempt]] = {}
    for job in listed:
        assert job.status == jobs_pb2.JOB_STATUS_SUCCEEDED, job
        assert (got[job.id].status, got[job.id].attempt) == (job.status, job.attempt)
        assert (rows[job.id]["status"], rows[job.id]["attempt"]) == ("succeeded", job.attempt)
        events = watched[job.id]
        assert_gap_free(events)
        assert [(e.sequence, e.type, event_payload(e)) for e in events] == [
            (e.sequence, e.type, e.payload) for e in logs[job.id]
        ]
        history = histories[job.id] = attempt_history(job.id, logs[job.id])
        # Exactly one terminal event, last, and it is the success; every earlier
        # attempt ended by losing its lease (nothing here fails or cancels).
        assert history[-1].closed_by == "job.succeeded" and history[-1].number == job.attempt
        assert {a.closed_by for a in history[:-1]} <= {"job.lease_expired"}, (job.id, history)
        # Valid leases never overlap in time either: each attempt closed before
        # the next one was claimed (commit order, one system clock).
        for before, after in zip(history, history[1:], strict=False):
            assert before.closed_at <= after.started_at, (job.id, history)
    attempts_in_logs = {(job_id, a.number): a for job_id, history in histories.items() for a in history}

    # ----- claims: each attempt was handed to exactly one process ------------------------
    started_by = collections.defaultdict(list)
    for index, server in enumerate(servers):
        for record in server.events("job.started"):
            started_by[(record["job_id"], record["attempt"])].append(index)
    assert {pair: who for pair, who in started_by.items() if len(who) > 1} == {}
    assert set(started_by) == set(attempts_in_logs)

    # ----- lost leases: only a frozen worker, or one that could not write, loses one ------
    # A lease taken from a live worker that kept renewing it would be two valid leases
    # at once, even though the log would look like any other expiry; so every
    # `job.lease_expired` must be explained by its holder's freeze overlapping the
    # attempt, or by storage trouble the holder logged for that job (an injected
    # COMMIT fault on its heartbeat or its completion).
    for (job_id, number), attempt in attempts_in_logs.items():
        if attempt.closed_by != "job.lease_expired":
            continue
        (holder,) = started_by[(job_id, number)]
        began, ended = freeze_walls.get(holder, (float("inf"), float("inf")))
        frozen_during = attempt.started_at <= ended and attempt.closed_at >= began
        troubled = any(
            r.get("job_id") == job_id and r.get("event") in STORAGE_TROUBLE_LOGS
            for r in servers[holder].records
        )
        assert frozen_during or troubled, (
            f"attempt {number} of {job_id} lost its lease though process {holder} was neither "
            f"frozen nor failing to write: {attempt}"
        )

    # ----- completions: exactly one accepted per job, by the holder of its final lease -------
    completed = collections.Counter()
    for index, server in enumerate(servers):
        for record in server.events("job.completed"):
            pair = (record["job_id"], record["attempt"])
            completed[record["job_id"]] += 1
            assert attempts_in_logs[pair].closed_by == "job.succeeded", record
            assert started_by[pair] == [index], record
    assert completed == collections.Counter(ids)

    # ----- executions: stale ones ran, and none of them changed anything -------------------
    records = list(iter_records(records_dir))
    executions = collections.Counter((r["job_id"], r["attempt"]) for r in records)
    assert {pair: n for pair, n in executions.items() if n > 1} == {}
    assert {r["pid"] for r in records} <= set(pids)
    stale: list[dict[str, Any]] = []
    for record in records:
        pair = (record["job_id"], record["attempt"])
        attempt = attempts_in_logs[pair]  # no execution without a claim in the log
        index = pids.index(record["pid"])
        assert started_by[pair] == [index], record
        if attempt.closed_by == "job.succeeded":
            # The accepted execution ran inside its lease: after the claim, before
            # the success was written.
            assert record["outcome"] == "returned", record
            assert attempt.started_at - 0.01 <= record["start_wall"], (record, attempt)
            assert record["end_wall"] <= attempt.closed_at + 0.01, (record, attempt)
        else:
            assert attempt.closed_by == "job.lease_expired", (record, attempt)
            stale.append(record)
    assert {(r["job_id"], r["attempt"]) for r in records if r["outcome"] == "returned"} >= {
        (job.id, job.attempt) for job in listed
    }
    stale_completions_rejected = 0  # a stale handler returned; its completion was refused
    stale_writes_rejected = 0  # ...by the fenced UPDATE itself (not the fenced read before it)
    for record in stale:
        server = servers[pids.index(record["pid"])]
        ends = [
            r
            for r in server.records
            if r.get("job_id") == record["job_id"]
            and r.get("attempt") == record["attempt"]
            and r.get("event") in ATTEMPT_END_LOGS
        ]
        # The stale attempt's end was refused (lease lost) or never written (a failed
        # commit); it was never reported as completed. (An attempt that logged no end
        # at all is in `silent`, reported below.)
        assert [r["event"] for r in ends] in ([], ["job.lease_lost"], ["job.record_failed"]), (record, ends)
        if ends and ends[0]["event"] == "job.lease_lost" and record["outcome"] == "returned":
            stale_completions_rejected += 1
            if ends[0].get("outcome") == "succeeded":
                stale_writes_rejected += 1
    stale_by_paused = collections.Counter(
        pids.index(r["pid"]) for r in stale if pids.index(r["pid"]) in paused
    )
    # The experiment proved something only if the frozen processes' work really ran
    # stale: each of them must have come back to at least one attempt it had lost.
    assert all(stale_by_paused[index] >= 1 for index in paused), stale_by_paused
    overlapped = 0
    for record in stale:
        later = attempts_in_logs.get((record["job_id"], record["attempt"] + 1))
        if later is not None and later.started_at < record["end_wall"]:
            overlapped += 1  # the next attempt was running while this stale one still ran
    # ...and at least once, the stale handler and its job's next, valid attempt ran at
    # the same time: the case fencing exists for.
    assert overlapped >= 1, stale

    write_failures = sum(len(server.events("storage.write_failed")) for server in servers)
    if fault_rate:
        assert write_failures > 0, "no injected fault was observed: the faults variant proved nothing"
    figures("processes", PROCESSES)
    figures("jobs", JOBS)
    figures("paused_processes", len(paused))
    figures("freezes_retried_inside_write_lock", freeze_retries)
    figures("attempts_total", len(attempts_in_logs))
    figures("max_attempt", max(job.attempt for job in listed))
    figures("stale_executions", len(stale))
    figures("stale_executions_paused", sum(stale_by_paused.values()))
    figures("stale_overlapping_next_attempt", overlapped)
    figures("stale_completions_rejected", stale_completions_rejected)
    figures("stale_writes_rejected", stale_writes_rejected)
    figures("write_failures_logged", write_failures)
    figures("attempts_ended_without_log", sum(len(pairs) for pairs in silent.values()))
    # DESIGN §3: "A lost lease stops the handler's right to finish (its completion is
    # rejected) and is logged." Every attempt a process claimed must end in its log
    # (job.completed, job.lease_lost, ...). Checked last so that a failure here still
    # lets every fencing check above run first.
    assert silent == {}, (
        "attempts that ended without any log record (claimed, then nothing: a lease lost "
        f"while the handler ran is not logged as job.lease_lost): {silent}"
    )

"""PostgreSQL as several replicas see it: one repository per replica, each with
its own writer, pool and listener, all on one database in the session's
throwaway cluster.

What SQLite's single write lock gives for free is proven here for concurrent
transactions: claims and lease recovery never hand a job out twice, event logs
stay gap-free, a lock conflict between two writers is retried rather than
surfaced, other replicas' commits arrive by notification, and connections the
server cut are replaced.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from leasehold._server.clock import ManualClock, SystemClock
from leasehold._server.jobs.errors import JobNotFound, StorageUnavailable
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.postgres import ChangeListener
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.sql.writer import GroupCommitWriter, WriteTx
from leasehold._server.jobs.watch import follow_events
from leasehold._server.runtime.long_poll import ClaimRequest, LongPollClaimer
from tests.conftest import Postgres
from tests.database_reads import rows
from tests.support import OWNER, make_repository

REPLICAS = 3
SOON = 10.0


@pytest.fixture
def database_url(postgres: Postgres) -> str:
    return postgres.fresh_database_url()


@pytest.fixture
async def open_replica(database_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Opens repositories on the test's database; closes them all at the end."""
    opened: list[SqlJobRepository] = []

    async def open_one(clock: Any = None) -> SqlJobRepository:
        repository = await make_repository(database_url, clock or SystemClock())
        opened.append(repository)
        return repository

    yield open_one
    for repository in opened:
        await repository.close()


def _new_job(**fields: Any) -> NewJob:
    return NewJob(owner_id=OWNER, kind="example.echo", payload={}, **fields)


def _event_logs(database_url: str) -> dict[str, list[tuple[int, str]]]:
    logs: dict[str, list[tuple[int, str]]] = {}
    for row in rows(database_url, "SELECT job_id, sequence, type FROM job_events ORDER BY job_id, sequence"):
        logs.setdefault(row["job_id"], []).append((row["sequence"], row["type"]))
    return logs


def _assert_gap_free(logs: dict[str, list[tuple[int, str]]]) -> None:
    for job_id, log in logs.items():
        assert [sequence for sequence, _ in log] == list(range(1, len(log) + 1)), (job_id, log)


async def test_replicas_claiming_at_once_never_share_a_job(
    open_replica: Callable[..., Any], database_url: str
) -> None:
    replicas = [await open_replica() for _ in range(REPLICAS)]
    for _ in range(10):
        await asyncio.gather(*(replicas[0].enqueue(_new_job()) for _ in range(50)))

    async def claim_until_empty(replica: SqlJobRepository, worker: str) -> list[str]:
        claimed: list[str] = []
        while True:
            result = await replica.claim(worker, 7, 30)
            if not result.jobs:
                return claimed
            claimed += [job.job.id for job in result.jobs]

    claims = await asyncio.gather(
        *(
            claim_until_empty(replica, f"w{index}-{slot}")
            for index, replica in enumerate(replicas)
            for slot in range(4)
        )
    )

    everything = [job_id for claimed in claims for job_id in claimed]
    assert len(everything) == 500
    assert len(set(everything)) == 500
    assert sum(1 for claimed in claims if claimed) > 1, "the claims did not overlap at all"
    logs = _event_logs(database_url)
    _assert_gap_free(logs)
    assert all([kind for _, kind in log] == ["job.queued", "job.started"] for log in logs.values())


async def test_claims_work_on_a_database_whose_default_isolation_is_serializable(
    postgres: Postgres, database_url: str, open_replica: Callable[..., Any]
) -> None:
    """Some operators make SERIALIZABLE the default: the writer names READ
    COMMITTED itself, which every statement is written for, so concurrent
    claims still neither fail nor share a job."""
    with postgres.cluster.connect() as admin:
        name = database_url.rsplit("/", 1)[1]
        admin.execute(f"ALTER DATABASE {name} SET default_transaction_isolation = 'serializable'")
    replicas = [await open_replica() for _ in range(REPLICAS)]
    assert rows(database_url, "SHOW default_transaction_isolation") == [
        {"default_transaction_isolation": "serializable"}
    ]
    level = await replicas[0]._writer.run(
        lambda tx: tx.conn.exec_driver_sql("SHOW transaction_isolation").scalar()
    )
    assert level == "read committed"
    await asyncio.gather(*(replicas[0].enqueue(_new_job()) for _ in range(150)))

    results = await asyncio.gather(
        *(replica.claim(f"w{index}-{n}", 5, 30) for index, replica in enumerate(replicas) for n in range(10))
    )

    claimed = [job.job.id for result in results for job in result.jobs]
    assert len(claimed) == 150
    assert len(set(claimed)) == 150


async def test_every_replica_recovering_expired_leases_at_once_recovers_each_once(
    open_replica: Callable[..., Any], database_url: str
) -> None:
    clock = ManualClock()
    replicas = [await open_replica(clock) for _ in range(REPLICAS)]
    for _ in range(4):
        await asyncio.gather(*(replicas[0].enqueue(_new_job()) for _ in range(50)))
    leased = await replicas[0].claim("doomed", 200, 10)
    assert len(leased.jobs) == 200

    clock.advance(11)
    results = await asyncio.gather(*(replica.claim(f"r{i}", 0, 30) for i, replica in enumerate(replicas * 3)))

    recovered = Counter(job_id for result in results for job_id in result.expired_job_ids)
    assert len(recovered) == 200
    assert set(recovered.values()) == {1}
    logs = _event_logs(database_url)
    _assert_gap_free(logs)
    assert all(
        [kind for _, kind in log] == ["job.queued", "job.started", "job.lease_expired"]
        for log in logs.values()
    )


async def test_appends_from_many_replicas_to_one_job_give_one_gap_free_log(
    open_replica: Callable[..., Any], database_url: str
) -> None:
    """A lease shared by every replica (as a stale worker and a live one could
    share a job): each append takes the next number under the row lock."""
    replicas = [await open_replica() for _ in range(REPLICAS)]
    job, _ = await replicas[0].enqueue(_new_job())
    lease = (await replicas[0].claim("w", 1, 60)).jobs[0].lease

    await asyncio.gather(
        *(replica.append_event(lease, "step", {"n": n}) for n in range(40) for replica in replicas)
    )

    log = _event_logs(database_url)[job.id]
    _assert_gap_free({job.id: log})
    assert len(log) == 2 + 40 * REPLICAS


async def test_an_enqueue_on_one_replica_wakes_an_idle_worker_on_another(
    open_replica: Callable[..., Any],
) -> None:
    idle, busy = await open_replica(), await open_replica()
    await idle.claim("idle-worker", 1, 30)  # starts its listener, as a worker's first claim does
    await _listening(idle)
    with idle.changes.watch_work() as wake:
        wake.clear()
        await busy.enqueue(_new_job())
        await asyncio.wait_for(wake.wait(), SOON)

    assert len((await idle.claim("idle-worker", 1, 30)).jobs) == 1


async def test_a_waiting_claim_on_one_replica_is_woken_by_an_enqueue_on_another(
    open_replica: Callable[..., Any],
) -> None:
    """WorkerService's long poll across replicas: the NOTIFY of another
    replica's commit ends the wait, long before the safety-net poll would."""
    idle, busy = await open_replica(), await open_replica()
    claimer = LongPollClaimer(idle, SystemClock(), lease_seconds=30, poll_seconds=600)
    await idle.claim("warm-up", 1, 30)  # starts its listener, as a worker's first claim does
    await _listening(idle)
    request = ClaimRequest(
        worker_id="remote", kinds=KindFilter(only=frozenset({"example.echo"})), limit=1, wait_seconds=600
    )
    waiting = asyncio.ensure_future(claimer.claim(request))
    await _until(lambda: claimer.waiting == 1)  # it has looked once, found nothing and is waiting
    assert not waiting.done()

    job, _ = await busy.enqueue(_new_job())

    (claimed,) = (await asyncio.wait_for(waiting, SOON)).jobs
    assert claimed.job.id == job.id and claimed.job.attempt == 1


async def test_events_appended_on_one_replica_reach_a_watcher_on_another(
    open_replica: Callable[..., Any],
) -> None:
    watching, working = await open_replica(), await open_replica()
    job, _ = await working.enqueue(_new_job())
    lease = (await working.claim("w", 1, 60)).jobs[0].lease
    seen: list[tuple[int, str]] = []

    async def watch() -> None:
        async for event in follow_events(watching, OWNER, job.id, 0):
            seen.append((event.sequence, event.type))

    watcher = asyncio.create_task(watch())
    await _listening(watching)
    await _until(lambda: len(seen) >= 2)
    for n in range(5):
        await working.append_event(lease, "progress", {"n": n})
        await _until(lambda n=n: len(seen) >= 3 + n)  # type: ignore[misc]
    await working.succeed(lease)
    await asyncio.wait_for(watcher, SOON)

    assert seen == [(1, "job.queued"), (2, "job.started")] + [(3 + n, "progress") for n in range(5)] + [
        (8, "job.succeeded")
    ]


async def test_connections_the_server_cut_are_replaced_without_failing_a_call(
    open_replica: Callable[..., Any], postgres: Postgres, database_url: str
) -> None:
    """Every connection of the database is cut, as a restart of PostgreSQL would
    cut them: the writer's held connection and the pooled read connections are
    found broken at their next use and replaced before anything was done on
    them, so the next write and read succeed; the listener reconnects; nothing
    acknowledged is gone. (While the server is actually down, calls answer
    UNAVAILABLE: tests/replicas/test_database_restart.py.)"""
    replica, other = await open_replica(), await open_replica()
    acknowledged = [(await replica.enqueue(_new_job()))[0].id for _ in range(5)]
    await replica.get(OWNER, acknowledged[0])  # a pooled read connection
    await replica.claim("w", 0, 30)
    await _listening(replica)
    listener_was = _listener_pid(database_url)

    with postgres.cluster.connect() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (database_url.rsplit("/", 1)[1],),
        )

    later = (await replica.enqueue(_new_job()))[0].id
    assert (await replica.get(OWNER, later)).id == later
    for job_id in acknowledged:
        assert (await replica.get(OWNER, job_id)).id == job_id

    await _until(lambda: _listener_pid(database_url) not in (None, listener_was))
    await _listening(replica)
    with replica.changes.watch_work() as wake:
        wake.clear()
        await other.enqueue(_new_job())
        await asyncio.wait_for(wake.wait(), SOON)


async def test_writers_that_deadlock_are_rolled_back_and_run_again(database_url: str) -> None:
    """Two writers each lock one row and then want the other's, the way a cancel
    and a batch of outcomes from two replicas can: PostgreSQL fails one of them,
    whose writer rolls back the whole batch (here two operations, each under
    its savepoint) and runs it again; every caller gets its answer, and what
    the rolled-back run wrote is there exactly once."""
    engines = [create_engines(database_url) for _ in range(2)]
    writers = [GroupCommitWriter(e.writer, ChangeHub(), e.dialect) for e in engines]
    with engines[0].writer.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE scratch (name TEXT PRIMARY KEY, touched INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO scratch VALUES ('a', 0), ('b', 0)")
    both_hold_one = threading.Barrier(2, timeout=10)
    runs = Counter[str]()

    def lock_in_order(first: str, second: str) -> Callable[[WriteTx], str]:
        def op(tx: WriteTx) -> str:
            runs[first] += 1
            touch = text("UPDATE scratch SET touched = touched + 1 WHERE name = :name")
            tx.conn.execute(touch, {"name": first})
            if runs[first] == 1:
                both_hold_one.wait()  # only the first run: the retry must get through
            tx.conn.execute(touch, {"name": second})
            return f"{first} then {second}"

        return op

    def mark(name: str) -> Callable[[WriteTx], str]:
        def op(tx: WriteTx) -> str:
            tx.conn.execute(text("INSERT INTO scratch VALUES (:name, 1)"), {"name": name})
            return f"marked {name}"

        return op

    try:
        # Queued together, each writer's two operations share one batch.
        answers = await asyncio.gather(
            writers[0].run(mark("x")),
            writers[0].run(lock_in_order("a", "b")),
            writers[1].run(mark("y")),
            writers[1].run(lock_in_order("b", "a")),
        )
    finally:
        for writer in writers:
            await writer.close()
        for e in engines:
            await e.dispose()

    assert answers == ["marked x", "a then b", "marked y", "b then a"]
    assert sorted(runs.values()) == [1, 2], runs  # exactly one of them ran again
    touched = rows(database_url, "SELECT name, touched FROM scratch ORDER BY name")
    assert touched == [
        {"name": "a", "touched": 2},
        {"name": "b", "touched": 2},
        {"name": "x", "touched": 1},
        {"name": "y", "touched": 1},
    ]


# ----- helpers -----------------------------------------------------------------------


async def _until(condition: Callable[[], bool], timeout: float = SOON) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def _listening(repository: SqlJobRepository) -> None:
    """Until the repository's listener has LISTENed (a notification sent before
    that is covered by the 'unknown changes' it announces, but a test that
    wants to see the notification itself must wait)."""
    await _until(lambda: _listener_count(repository) > 0)


def _listener_count(repository: SqlJobRepository) -> int:
    listener = repository._feed
    assert isinstance(listener, ChangeListener)
    return 1 if listener.listening.is_set() else 0


async def _until_blocked_on_a_lock(database_url: str) -> None:
    """Until a session of this database waits for a lock: the statement under test has
    reached the row the test holds. A sleep could only hope it had, and on a loaded machine
    it may not have begun."""
    statement = (
        "SELECT count(*) AS n FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    await _until(lambda: rows(database_url, statement)[0]["n"] >= 1)


def _listener_pid(database_url: str) -> int | None:
    found = rows(
        database_url,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'",
    )
    return int(found[0]["pid"]) if len(found) == 1 else None


async def test_a_job_locked_by_a_stalled_session_holds_up_its_own_caller_only_for_a_while(
    postgres: Postgres, database_url: str, open_replica: Callable[..., Any]
) -> None:
    """Another session (a replica frozen mid-transaction) holds a job's row lock:
    a Cancel of that job gives up after the writer's lock timeout with
    UNAVAILABLE instead of stalling this replica's writer for good, and a write
    queued behind it goes through. The server also ends such a stalled session
    of ours after 10 s (idle_in_transaction_session_timeout)."""
    replica = await open_replica()
    job, _ = await replica.enqueue(_new_job())
    settings = await replica._writer.run(
        lambda tx: (
            tx.conn.exec_driver_sql("SHOW lock_timeout").scalar(),
            tx.conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar(),
        )
    )
    assert settings == ("5s", "10s")
    stalled = postgres.cluster.connect(database_url.rsplit("/", 1)[1])
    try:
        stalled.execute("BEGIN")
        stalled.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", (job.id,))

        cancel = asyncio.create_task(replica.cancel(OWNER, job.id))
        await _until_blocked_on_a_lock(database_url)  # the cancel took the writer and waits
        other, _ = await asyncio.wait_for(replica.enqueue(_new_job()), 30)
        with pytest.raises(StorageUnavailable):
            await asyncio.wait_for(cancel, 30)
    finally:
        stalled.close()

    assert (await replica.get(OWNER, other.id)).id == other.id
    assert (await replica.cancel(OWNER, job.id)).status.value == "cancelled"


async def test_a_retry_waits_for_a_retention_delete_of_its_source_and_then_finds_nothing(
    postgres: Postgres, database_url: str, open_replica: Callable[..., Any]
) -> None:
    """Another replica's retention batch has deleted a finished job and not yet
    committed. A Retry of that job waits for the batch (it locks its source)
    and then answers NOT_FOUND, rather than reading the old row and making a
    retry whose source is gone."""
    replica = await open_replica()
    job, _ = await replica.enqueue(_new_job())
    assert (await replica.cancel(OWNER, job.id)).status.value == "cancelled"  # retryable
    sweeping = postgres.cluster.connect(database_url.rsplit("/", 1)[1])
    try:
        sweeping.execute("BEGIN")
        sweeping.execute("DELETE FROM jobs WHERE id = %s", (job.id,))
        retry = asyncio.create_task(replica.retry(OWNER, job.id))
        await _until_blocked_on_a_lock(database_url)
        assert not retry.done()
        sweeping.execute("COMMIT")
        with pytest.raises(JobNotFound):
            await asyncio.wait_for(retry, 30)
    finally:
        sweeping.close()
    assert rows(database_url, "SELECT id FROM jobs") == []


async def test_a_stalled_retention_batch_holds_up_no_enqueue_or_claim(
    postgres: Postgres, database_url: str, open_replica: Callable[..., Any]
) -> None:
    """Retention deletes on a writer of its own on PostgreSQL: with its batch
    stuck on a lock, this replica's enqueues and claims still go through at once
    (on the shared writer they queued behind the batch until its lock timed out)."""
    replica = await open_replica()
    finished, _ = await replica.enqueue(_new_job())
    assert (await replica.cancel(OWNER, finished.id)).status.value == "cancelled"
    holding = postgres.cluster.connect(database_url.rsplit("/", 1)[1])
    try:
        holding.execute("BEGIN")
        holding.execute("SELECT sequence FROM job_events WHERE job_id = %s FOR UPDATE", (finished.id,))
        sweep = asyncio.create_task(replica.delete_expired(datetime.now(UTC) + timedelta(seconds=1), 10))
        await _until_blocked_on_a_lock(database_url)
        assert not sweep.done()  # the batch waits for the events' lock
        queued, _ = await asyncio.wait_for(replica.enqueue(_new_job()), SOON)
        claimed = await asyncio.wait_for(replica.claim("w", 1, 30), SOON)
        assert [job.job.id for job in claimed.jobs] == [queued.id]
        # Both went through while the batch still waits: queued behind it on one writer, they
        # would have come back only once its lock wait had ended it (lock_timeout, 5 s).
        assert not sweep.done()
        holding.execute("COMMIT")
        assert await asyncio.wait_for(sweep, 30) == 1
    finally:
        holding.close()

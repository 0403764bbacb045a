"""Rescue with every replica saturated (DESIGN §9, the rescuer), on PostgreSQL.

Two replicas (`--concurrency 1` each) each run a long `example.sleep` job in
their only slot, so neither claims. A third process claims a third job and is
frozen with SIGSTOP (outside any transaction) before its first heartbeat, so its
lease lapses a lease after its `job.started`. Nothing claims after that; a
replica's rescuer must requeue the third job within about one rescue interval of
the expiry, exactly once although both rescuers run, while both replicas are
still busy. The times are read from the database and bounded as in
tests/system/test_rescue.py.
"""

from __future__ import annotations

import functools

import pytest

from tests.conftest import Postgres
from tests.reliability.test_concurrent_claimers import in_transaction, sessions_of, with_application_name
from tests.replicas.support import HANDLERS, Track, start_replicas, started_attempts, worker_id
from tests.system.helpers import Client, Leasehold, job_row, wait_until
from tests.system.test_rescue import (
    LONG_JOB,
    RESCUE_FLAGS,
    SERVE_FLAGS,
    assert_rescued_in_time,
    await_rescue,
    freeze,
    start_long_job,
)

pytestmark = pytest.mark.slow

STALLED = "rescue-stalled"  # the frozen process's application_name


@pytest.mark.timeout(180)
def test_saturated_replicas_rescue_a_frozen_processs_job(postgres: Postgres, processes: Track) -> None:
    url = postgres.fresh_database_url()
    replicas = start_replicas(processes, url, 2, *SERVE_FLAGS, *RESCUE_FLAGS)
    with Client(replicas[0].port or 0) as client:
        long_ids = {client.enqueue("example.sleep", LONG_JOB).id for _ in replicas}
    wait_until(
        lambda: all(len(started_attempts(replica)) == 1 for replica in replicas),
        timeout=30,
        what="each replica to run one long job",
    )
    stalled = processes(Leasehold.serve(with_application_name(url, STALLED), *SERVE_FLAGS, *HANDLERS))
    stalled.start(timeout=60)
    job_id = start_long_job(stalled)
    assert sessions_of(url, STALLED) > 0  # else the freeze could not see its transactions
    freeze(stalled, functools.partial(in_transaction, url, STALLED))

    rescue = await_rescue(url, job_id)

    assert_rescued_in_time(rescue)
    row = job_row(url, job_id)
    assert (row["status"], row["attempt"], row["lease_owner"]) == ("queued", 1, None), row
    # Both replicas still busy with their own long job, neither having claimed again.
    holders = {job_row(url, long_id)["lease_owner"] for long_id in long_ids}
    assert holders == {worker_id(replica) for replica in replicas}
    assert {long_id for replica in replicas for long_id, _ in started_attempts(replica)} == long_ids
    # One rescuer recovered it, once; the other found nothing to do.
    wait_until(
        lambda: any(replica.events_for("job.lease_expired", job_id) for replica in replicas),
        timeout=5,
        what="the rescue's log",
    )
    logged = [len(replica.events_for("job.lease_expired", job_id)) for replica in replicas]
    assert sorted(logged) == [0, 1], logged
    print(f"rescued by replica {logged.index(1)}")

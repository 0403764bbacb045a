"""Remote workers that die, freeze, ignore a cancel, or lose their server: real
`leasehold serve` and `leasehold worker` processes on a real database (each
engine). A dead or frozen worker's job runs again as the next attempt; the old
attempt can write nothing more; no two attempts ever complete."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2, worker_pb2
from tests import database_reads
from tests.remote.support import AUTH, as_log, attempt_windows, free_port, serve, worker, worker_stub
from tests.system.helpers import Client, assert_gap_free, event_payload, iter_records, types, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def records(tmp_path: Path) -> Path:
    directory = tmp_path / "records"
    directory.mkdir()
    return directory


def lease_token(database_url: str, job_id: str) -> str:
    token = database_reads.scalar(database_url, "SELECT lease_token FROM jobs WHERE id = :id", id=job_id)
    assert token, "the job holds no lease"
    return str(token)


def test_a_sigkilled_workers_job_runs_again_and_its_late_complete_is_aborted(
    tmp_path: Path, database_url: str, records: Path, processes
) -> None:
    server = serve(processes, database_url, records)
    gate = tmp_path / "gate"
    first = worker(processes, server.port, records)
    with Client(server.port) as client:
        job = client.enqueue("remote.block", {"gate": str(gate)})
        client.events_until(job.id, lambda e: e.type == "progress")
        saved = worker_pb2.CompleteRequest(job_id=job.id, lease_token=lease_token(database_url, job.id))

        first.kill()  # SIGKILL mid-job: no hand-back, no last write
        gate.touch()
        worker(processes, server.port, records)
        done = client.wait_terminal(job.id, timeout=60)
        events = client.all_events(job.id)

        assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED and done.attempt == 2
        assert types(events).count("job.lease_expired") == 1
        assert [attempt for attempt, _ in attempt_windows(as_log(events))] == [1, 2]
        assert_gap_free(events)

        # The dead worker's Complete, replayed from the request it would have sent.
        channel, stub = worker_stub(server.port)
        with channel, pytest.raises(grpc.RpcError) as refused:
            stub.Complete(saved, metadata=AUTH, timeout=10)
        assert refused.value.code() == grpc.StatusCode.ABORTED
        assert client.all_events(job.id) == events


def test_a_worker_frozen_past_its_lease_is_fenced_out_when_it_resumes(
    tmp_path: Path, database_url: str, records: Path, processes
) -> None:
    server = serve(processes, database_url, records)
    frozen = worker(processes, server.port, records)
    with Client(server.port) as client:
        job = client.enqueue("remote.record", {"seconds": 3})
        client.events_until(job.id, lambda e: e.type == "job.started")
        frozen_lease = worker_pb2.LeaseRef(job_id=job.id, lease_token=lease_token(database_url, job.id))
        assert frozen.process is not None
        frozen.process.send_signal(signal.SIGSTOP)
        try:
            # Its lease (6 s) lapses; another worker runs attempt 2.
            worker(processes, server.port, records)
            client.events_until(
                job.id, lambda e: e.type == "job.started" and event_payload(e)["attempt"] == 2, timeout=60
            )
            # What the frozen worker will hear when it resumes: its heartbeat
            # says lost, and every write under its lease is refused.
            channel, stub = worker_stub(server.port)
            with channel:
                beats = worker_pb2.HeartbeatRequest(leases=[frozen_lease])
                beat = stub.Heartbeat(beats, metadata=AUTH, timeout=10)
                assert [(s.job_id, s.lost) for s in beat.states] == [(job.id, True)]
                for write in (
                    lambda: stub.AppendEvent(
                        worker_pb2.AppendEventRequest(
                            job_id=job.id, lease_token=frozen_lease.lease_token, type="progress"
                        ),
                        metadata=AUTH,
                        timeout=10,
                    ),
                    lambda: stub.Complete(
                        worker_pb2.CompleteRequest(job_id=job.id, lease_token=frozen_lease.lease_token),
                        metadata=AUTH,
                        timeout=10,
                    ),
                ):
                    with pytest.raises(grpc.RpcError) as refused:
                        write()
                    assert refused.value.code() is grpc.StatusCode.ABORTED
        finally:
            frozen.process.send_signal(signal.SIGCONT)
        done = client.wait_terminal(job.id, timeout=60)
        events = client.all_events(job.id)

    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED and done.attempt == 2
    assert types(events).count("job.succeeded") == 1  # no two attempts complete
    assert [attempt for attempt, _ in attempt_windows(as_log(events))] == [1, 2]
    # The resumed worker heard that its lease was gone and wrote nothing for attempt 1.
    wait_until(lambda: frozen.events("job.lease_lost"), 30, "the frozen worker to see its lease lost")
    assert (server.returncode, frozen.returncode) == (None, None)


def test_a_cancel_reaches_a_remote_handler_through_its_heartbeat(
    tmp_path: Path, database_url: str, records: Path, processes
) -> None:
    server = serve(processes, database_url, records)
    remote = worker(processes, server.port, records)
    with Client(server.port) as client:
        job = client.enqueue("remote.block", {"gate": str(tmp_path / "never")})
        client.events_until(job.id, lambda e: e.type == "progress")
        client.cancel(job.id)
        done = client.wait_terminal(job.id, timeout=30)
        events = client.all_events(job.id)

    assert done.status == jobs_pb2.JOB_STATUS_CANCELLED
    assert types(events)[-2:] == ["job.cancel_requested", "job.cancelled"]
    # The handler stopped itself (ConfirmCancel), well inside the grace.
    wait_until(lambda: remote.events("job.cancelled"), 10, "the worker to log the cancel")


def test_a_remote_handler_that_ignores_a_cancel_is_fenced_out_after_the_grace(
    tmp_path: Path, database_url: str, records: Path, processes
) -> None:
    server = serve(processes, database_url, records, "--cancel-grace-seconds", "1")
    gate = tmp_path / "gate"
    stubborn = worker(processes, server.port, records)
    with Client(server.port) as client:
        job = client.enqueue("remote.stubborn", {"gate": str(gate)})
        client.events_until(job.id, lambda e: e.type == "job.started")
        requested = time.monotonic()
        client.cancel(job.id)
        done = client.wait_terminal(job.id, timeout=30)
        ended_after = time.monotonic() - requested
        # The handler returns now; its Complete is refused.
        gate.touch()
        wait_until(lambda: stubborn.events("job.lease_lost"), 30, "the worker's late write to be refused")
        events = client.all_events(job.id)

    assert done.status == jobs_pb2.JOB_STATUS_CANCELLED
    assert ended_after >= 1.0  # not before the grace
    assert types(events).count("job.cancelled") == 1 and "job.succeeded" not in types(events)


def test_workers_ride_out_a_server_restart_during_their_long_polls(
    tmp_path: Path, database_url: str, records: Path, processes
) -> None:
    port = free_port()
    server = serve(processes, database_url, records, port=port)
    workers = [worker(processes, port, records, "--concurrency", "4") for _ in range(2)]
    time.sleep(0.5)  # both now wait in a long poll
    with Client(port) as client:
        before = [client.enqueue("remote.record", {"seconds": 0.01}).id for _ in range(20)]
        wait_until(
            lambda: all(client.get(job_id).status == jobs_pb2.JOB_STATUS_SUCCEEDED for job_id in before),
            60,
            "the first jobs to finish",
        )
    server.kill()  # mid long-poll: every worker's Claim breaks
    time.sleep(1.0)
    server = serve(processes, database_url, records, port=port)
    with Client(port) as client:
        after = [client.enqueue("remote.record", {"seconds": 0.01}).id for _ in range(20)]
        for job_id in before + after:
            done = client.wait_terminal(job_id, timeout=60)
            assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED
            events = client.all_events(job_id)
            assert types(events).count("job.succeeded") == 1
            assert_gap_free(events)
    # The same worker processes, reconnected, ran the jobs enqueued after the restart.
    assert all(process.returncode is None for process in workers)
    worker_pids = {process.process.pid for process in workers if process.process is not None}
    ran = {record["job_id"]: record["pid"] for record in iter_records(records)}
    assert {ran[job_id] for job_id in after} <= worker_pids

"""A real `leasehold serve` routing a kind to remote workers, and a real
`leasehold worker` running it from an ordinary handler module: the job an owner
enqueues through JobService succeeds with its result visible in Get."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from leasehold.client import to_dict
from leasehold.v1 import jobs_pb2
from tests.remote_worker.fake_server import TOKEN
from tests.support import sqlite_url
from tests.system.helpers import EXIT_SECONDS, Client, Leasehold, event_payload, wait_until

pytestmark = pytest.mark.slow

HANDLERS = "tests.remote_worker.handlers"


def test_a_remote_kind_runs_on_the_worker_process_and_its_result_is_in_get(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    token = {"LEASEHOLD_WORKER_TOKEN": TOKEN}
    server = processes(
        Leasehold.serve(sqlite_url(tmp_path), "--remote-kinds", "remote.*", "--lease-seconds", "6", env=token)
    )
    port = server.start()
    worker = processes(
        Leasehold(
            "worker",
            "--server",
            f"127.0.0.1:{port}",
            "--handlers",
            HANDLERS,
            "--worker-id",
            "e2e-1",
            env=token,
        )
    )
    worker.launch()
    wait_until(lambda: worker.events("worker.started"), 30, "the worker to start")
    with Client(port) as client:
        job = client.enqueue("remote.double", {"n": 21})
        done = client.wait_terminal(job.id)
        assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED, done
        got = client.get(job.id)
        assert dict(got.result) == {"doubled": 42}
        assert [event_payload(event) for event in client.all_events(job.id) if event.type == "progress"] == [
            {"half": True}
        ]
    assert worker.events_for("job.completed", job.id)
    assert not server.events_for("job.started", job.id)  # the in-process runtime never ran it
    assert worker.interrupt() < EXIT_SECONDS
    assert worker.returncode == 0, worker.output[-2000:]
    assert TOKEN not in worker.output and TOKEN not in server.output


def test_a_remote_handler_reads_its_parents_results(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    port, worker = _serve_and_work(tmp_path, processes, lease_seconds=6)
    with Client(port) as client:
        first = client.enqueue("remote.double", {"n": 1})
        second = client.enqueue("remote.double", {"n": 20})
        child = client.enqueue("remote.add-up", depends_on=[second.id, first.id])
        assert client.wait_terminal(child.id).status == jobs_pb2.JOB_STATUS_SUCCEEDED
        assert to_dict(client.get(child.id).result) == {"sum": 42, "from": [second.id, first.id]}
    assert worker.interrupt() < EXIT_SECONDS and worker.returncode == 0


def test_a_cancel_reaches_the_remote_handler_and_sigterm_hands_a_running_job_back(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    port, worker = _serve_and_work(tmp_path, processes, lease_seconds=6)
    with Client(port) as client:
        cancelled = client.enqueue("remote.hold")
        wait_until(lambda: worker.events_for("job.started", cancelled.id), 30, "the first job to start")
        client.cancel(cancelled.id)
        assert client.wait_terminal(cancelled.id).status == jobs_pb2.JOB_STATUS_CANCELLED
        assert worker.events_for("job.cancelled", cancelled.id)  # confirmed by the worker, not the grace
        handed_back = client.enqueue("remote.hold")
        wait_until(lambda: worker.events_for("job.started", handed_back.id), 30, "the second job to start")
        assert worker.interrupt(signum=signal.SIGTERM) < EXIT_SECONDS
        job = client.get(handed_back.id)
        assert (job.status, job.attempt) == (jobs_pb2.JOB_STATUS_QUEUED, 0), job
    assert worker.events_for("job.released", handed_back.id)
    assert worker.returncode == 0, worker.output[-2000:]


def test_a_cancel_reaches_a_long_polling_worker_long_before_its_next_heartbeat(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    """With 300 s leases the worker heartbeats every 100 s; its Claim, waiting
    for more work meanwhile, names the attempt it holds, so the cancel ends
    that wait and reaches the handler at once (protocol 2)."""
    port, worker = _serve_and_work(tmp_path, processes, lease_seconds=300)
    with Client(port) as client:
        job = client.enqueue("remote.hold")
        wait_until(lambda: worker.events_for("job.started", job.id), 30, "the job to start")
        client.cancel(job.id)
        # Far less than the 100 s to the next heartbeat, and than the 300 s grace.
        assert client.wait_terminal(job.id, timeout=30).status == jobs_pb2.JOB_STATUS_CANCELLED
    assert worker.events_for("job.cancelled", job.id)  # confirmed by the worker
    assert worker.interrupt() < EXIT_SECONDS and worker.returncode == 0


def _serve_and_work(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold], lease_seconds: int
) -> tuple[int, Leasehold]:
    """A serve routing `remote.*` to workers, and one `leasehold worker` for
    them, started; the server's port and the worker."""
    token = {"LEASEHOLD_WORKER_TOKEN": TOKEN}
    lease = ("--lease-seconds", str(lease_seconds))
    server = processes(Leasehold.serve(sqlite_url(tmp_path), "--remote-kinds", "remote.*", *lease, env=token))
    port = server.start()
    worker = processes(
        Leasehold("worker", "--server", f"127.0.0.1:{port}", "--handlers", HANDLERS, env=token)
    )
    worker.launch()
    wait_until(lambda: worker.events("worker.started"), 30, "the worker to start")
    return port, worker

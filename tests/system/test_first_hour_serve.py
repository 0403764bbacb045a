"""What a new user meets when starting and stopping `leasehold serve`
(DESIGN §19), on real processes:

- a second `serve` on an address another process listens on exits 2 with one
  line naming it, for the gRPC, metrics and dashboard listeners alike (gRPC's
  default SO_REUSEPORT would otherwise let both listen and split the calls);
- the drain says what it waits for; a remote attempt gets the same grace as a
  local one (its worker's Complete is answered after the SIGTERM); a waiting
  Claim answers empty, not CANCELLED; a second SIGTERM hands the rest back at
  once instead of waiting out the grace.
"""

from __future__ import annotations

import secrets
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from leasehold.v1 import worker_pb2, worker_pb2_grpc
from tests.system.helpers import Client, Leasehold, job_row, wait_until

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(24)
WORKER_AUTH = (("authorization", f"Bearer {TOKEN}"),)
# Far longer than the test: the drain must end by the attempts ending or by
# the second signal, never by running out of grace.
LONG_GRACE = "300"


@contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port some other program listens on (plain SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def refused(database_url: str, *flags: str) -> Leasehold:
    second = Leasehold("serve", "--database-url", database_url, *flags).launch()
    second.wait_exit(60)
    return second


def test_a_second_serve_on_the_same_address_exits_2_naming_it(database_url: str, processes, tmp_path) -> None:
    first = processes(Leasehold.serve(database_url))
    port = first.start()
    other_database = f"sqlite+aiosqlite:///{tmp_path / 'other.db'}"

    second = refused(other_database, "--listen", f"127.0.0.1:{port}")

    assert second.returncode == 2
    assert second.raw_lines == [
        f"leasehold: listen: cannot bind 127.0.0.1:{port}: Address already in use "
        "(another process listens there)\n"
    ]
    # The first server still answers alone, from its own database.
    with Client(port) as client:
        job = client.enqueue("example.echo", {"n": 1})
        assert client.get(job.id).id == job.id
    assert not (tmp_path / "other.db").exists()  # refused before it touched a database


@pytest.mark.parametrize("flag", ["--metrics-listen", "--dashboard-listen"])
def test_a_taken_metrics_or_dashboard_address_exits_2_naming_the_flag(database_url: str, flag: str) -> None:
    with taken_port() as port:
        extra = ("--auth", "header", "--allow-insecure-header-auth") if flag == "--dashboard-listen" else ()
        second = refused(database_url, "--listen", "127.0.0.1:0", flag, f"127.0.0.1:{port}", *extra)
    assert second.returncode == 2
    assert second.raw_lines == [
        f"leasehold: {flag}: cannot bind 127.0.0.1:{port}: Address already in use "
        "(another process listens there)\n"
    ]


class RemoteWorker:
    """A hand-written remote worker's calls, as any language would make them."""

    def __init__(self, port: int) -> None:
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = worker_pb2_grpc.WorkerServiceStub(self._channel)

    def claim(self, wait_seconds: int = 10) -> list[worker_pb2.ClaimedJob]:
        request = worker_pb2.ClaimRequest(worker_id="w-1", kinds=["remote.work"], wait_seconds=wait_seconds)
        return list(self.stub.Claim(request, metadata=WORKER_AUTH, timeout=60).jobs)

    def complete(self, claimed: worker_pb2.ClaimedJob) -> None:
        request = worker_pb2.CompleteRequest(job_id=claimed.job.id, lease_token=claimed.lease_token)
        self.stub.Complete(request, metadata=WORKER_AUTH, timeout=30)

    def close(self) -> None:
        self._channel.close()


def serve_with_remote_kinds(database_url: str, *extra: str) -> Leasehold:
    return Leasehold.serve(
        database_url,
        "--remote-kinds",
        "remote.*",
        "--shutdown-grace",
        LONG_GRACE,
        *extra,
        env={"LEASEHOLD_WORKER_TOKEN": TOKEN},
    )


def test_a_remote_attempt_gets_the_grace_and_a_waiting_claim_answers_empty(
    database_url: str, processes
) -> None:
    # At debug level the server says when a Claim goes to sleep waiting for work.
    server = processes(serve_with_remote_kinds(database_url, "--log-level", "debug"))
    port = server.start()
    worker = RemoteWorker(port)
    try:
        with Client(port) as client:
            job = client.enqueue("remote.work", {})
        held = worker.claim()
        assert [claimed.job.id for claimed in held] == [job.id]
        answers: list[object] = []
        waiting = threading.Thread(target=lambda: answers.append(_claim_outcome(worker)))
        waiting.start()
        wait_until(lambda: server.events("worker.claim_waiting"), 30, "the Claim to wait for work")

        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        waiting.join(60)
        assert answers == [[]]  # empty and OK: not CANCELLED, not UNAVAILABLE
        draining = wait_until(lambda: server.events("server.draining"), 30, "the drain")
        assert draining[0]["message"].startswith("draining: 1 attempt running, up to 300 s")
        assert (draining[0]["local_attempts"], draining[0]["remote_attempts"]) == (0, 1)
        assert server.returncode is None  # still serving: the remote attempt has its grace

        worker.complete(held[0])  # answered after the SIGTERM
        server.wait_exit(60)  # and the drain ends with it, long before the grace
    finally:
        worker.close()
    assert server.returncode == 0
    assert job_row(database_url, job.id)["status"] == "succeeded"
    assert [record["ended"] for record in server.events("server.drained")] == ["finished"]


def _claim_outcome(worker: RemoteWorker) -> object:
    try:
        return worker.claim(wait_seconds=60)
    except grpc.RpcError as exc:
        return exc.code()


def test_a_second_sigterm_hands_the_local_attempt_back_at_once(database_url: str, processes) -> None:
    server = processes(serve_with_remote_kinds(database_url))
    port = server.start()
    worker = RemoteWorker(port)
    try:
        with Client(port) as client:
            local = client.enqueue("example.sleep", {"seconds": 600, "steps": 600})
            remote = client.enqueue("remote.work", {})
            client.events_until(local.id, lambda event: event.type == "job.started")
        held = worker.claim()
        assert [claimed.job.id for claimed in held] == [remote.id]

        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        draining = wait_until(lambda: server.events("server.draining"), 30, "the drain")
        assert draining[0]["message"] == (
            "draining: 2 attempts running, up to 300 s; send SIGINT or SIGTERM again to hand them back now"
        )
        server.process.send_signal(signal.SIGTERM)
        server.wait_exit(60)  # the grace is 300 s: only the second signal ends it this soon
    finally:
        worker.close()
    assert server.returncode == 0
    drained = server.events("server.drained")
    assert [
        (record["ended"], record["handed_back"], record["remote_attempts_left"]) for record in drained
    ] == [("hurried", 1, 1)]
    handed_back = job_row(database_url, local.id)
    assert (handed_back["status"], handed_back["attempt"]) == ("queued", 0)
    # The remote attempt keeps its lease: its worker reports to the next server.
    assert job_row(database_url, remote.id)["status"] == "running"

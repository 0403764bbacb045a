"""`serve --processes N` (DESIGN §20): N processes on one address and one
database, operated as one. Each test runs real `leasehold serve` processes
over real ports; which process a connection reaches is the kernel's choice,
so the tests learn it from each process's own /metrics port."""

from __future__ import annotations

import os
import signal
import socket
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.support import ENGINES, fresh_database_url, owner_metadata, sqlite_url
from tests.system.helpers import EXIT_SECONDS, Client, Leasehold, run_cli, struct, wait_until

pytestmark = pytest.mark.slow

# Longer than any wait below: a process that learned of its sibling's commits
# only by polling the file would miss every bound here.
POLL_SECONDS = "60"


def free_port_pair() -> int:
    """A port P with P + 1 free too (each process's metrics takes its own)."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return int(port)
    raise AssertionError("no two free ports in a row")


def gauge(metrics_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not on :{metrics_port}")


def start_two(
    processes: Callable[[Leasehold], Leasehold], database_url: str, *extra: str
) -> tuple[Leasehold, int]:
    """`serve --processes 2`, started, once both processes have said so; and its port."""
    serve = processes(Leasehold.serve(database_url, "--processes", "2", *extra))
    port = serve.start()
    wait_until(lambda: len(serve.events("server.started")) == 2, 30, "both processes to start")
    return serve, port


def own_connection(port: int) -> grpc.Channel:
    """A channel with a TCP connection of its own (gRPC shares them by default),
    so that the kernel picks a process for it afresh."""
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])


@pytest.mark.parametrize("engine", ENGINES)
def test_watchers_on_every_process_see_a_job_another_one_runs(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, processes
) -> None:
    database_url = fresh_database_url(engine, request, tmp_path)
    metrics = free_port_pair()
    serve, port = start_two(
        processes, database_url, "--poll-seconds", POLL_SECONDS, "--metrics-listen", f"127.0.0.1:{metrics}"
    )
    assert {record["port"] for record in serve.events("server.started")} == {port}

    with Client(port) as client:
        job = client.enqueue("example.sleep", {"seconds": 1, "steps": 5})
    # Open watch streams, each on a connection of its own, until both processes hold some.
    channels: list[grpc.Channel] = []
    calls = []
    received: list[list[jobs_pb2.JobEvent]] = []

    def read(call, into: list[jobs_pb2.JobEvent]) -> None:
        for response in call:
            into.append(response.event)

    try:
        while (
            min(gauge(metrics, "leasehold_watch_streams"), gauge(metrics + 1, "leasehold_watch_streams")) < 1
        ):
            assert len(channels) < 64, "the kernel sent 64 connections to one process"
            channel = own_connection(port)
            channels.append(channel)
            call = jobs_pb2_grpc.JobServiceStub(channel).WatchEvents(
                jobs_pb2.WatchEventsRequest(job_id=job.id), metadata=owner_metadata(), timeout=30
            )
            into: list[jobs_pb2.JobEvent] = []
            received.append(into)
            calls.append(call)
            threading.Thread(target=read, args=(call, into), daemon=True).start()
            # Counted once the server has the stream: its first event (job.enqueued) arrived.
            wait_until(lambda into=into: into, 10, "the stream's first event")
        wait_until(
            lambda: all(events and events[-1].type == "job.succeeded" for events in received),
            15,
            "every watcher to see the job succeed",
        )
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            channel.close()

    expected = [event.sequence for event in received[0]]
    assert expected == list(range(1, len(expected) + 1))
    assert all([event.sequence for event in events] == expected for events in received)


def test_one_signal_drains_every_process_and_the_supervisor_exits_0(tmp_path: Path, processes) -> None:
    serve, _ = start_two(processes, sqlite_url(tmp_path))

    assert serve.interrupt(signum=signal.SIGTERM) < EXIT_SECONDS
    assert serve.returncode == 0
    assert sorted(record["process"] for record in serve.events("server.stopped")) == [0, 1]
    # One drain each: the children never saw a second signal (a terminal's Ctrl-C
    # reaches them only through the supervisor).
    assert "server.hurrying" not in serve.output


def test_a_child_that_dies_takes_the_group_down_with_its_status(tmp_path: Path, processes) -> None:
    serve, _ = start_two(processes, sqlite_url(tmp_path))
    (started,) = serve.events("server.processes")
    victim, survivor = started["pids"]

    os.kill(victim, signal.SIGKILL)
    serve.wait_exit(EXIT_SECONDS * 2)

    assert serve.returncode == 128 + signal.SIGKILL
    (exited,) = serve.events("server.process_exited")
    assert exited["status"] == 128 + signal.SIGKILL
    assert [record["process"] for record in serve.events("server.stopped")] == [1 - exited["process"]]
    with pytest.raises(ProcessLookupError):
        os.kill(survivor, 0)


def test_children_drain_when_their_supervisor_is_killed(tmp_path: Path, processes) -> None:
    serve, _ = start_two(processes, sqlite_url(tmp_path))
    (started,) = serve.events("server.processes")

    serve.kill()
    serve.wait_exit(EXIT_SECONDS)  # the children still hold its output open until they end

    assert len(serve.events("server.supervisor_gone")) == 2
    assert sorted(record["process"] for record in serve.events("server.stopped")) == [0, 1]
    for pid in started["pids"]:
        wait_until(lambda pid=pid: not _alive(pid), EXIT_SECONDS, f"child {pid} to be reaped")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_taken_address_or_a_bad_count_is_one_line_and_exit_2(tmp_path: Path) -> None:
    database_url = sqlite_url(tmp_path)
    for count in ("0", "1000", "two"):
        done = run_cli("serve", "--database-url", database_url, "--processes", count, timeout=30)
        assert done.returncode == 2, done.stderr
        assert "--processes" in done.stderr and "Traceback" not in done.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = run_cli("serve", "--database-url", database_url, "--processes", "2", "--listen", address)
    assert done.returncode == 2, done.stderr
    assert f"listen: cannot bind {address}" in done.stderr


def test_one_address_spreads_connections_and_every_call_is_answered(tmp_path: Path, processes) -> None:
    """Calls on many fresh connections, over both processes: none is refused
    (the supervisor's held socket never listens, so none waits on it)."""
    metrics = free_port_pair()
    serve, port = start_two(processes, sqlite_url(tmp_path), "--metrics-listen", f"127.0.0.1:{metrics}")

    ids = []
    for _ in range(40):
        with own_connection(port) as channel:
            request = jobs_pb2.EnqueueRequest(kind="example.sleep", payload=struct({"seconds": 0}))
            response = jobs_pb2_grpc.JobServiceStub(channel).Enqueue(
                request, metadata=owner_metadata(), timeout=10
            )
            ids.append(response.job.id)

    def enqueued_by(metrics_port: int) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "leasehold_jobs_enqueued_total"
        )

    counts = [enqueued_by(metrics), enqueued_by(metrics + 1)]
    assert sum(counts) == 40 and min(counts) > 0, counts
    with Client(port) as client:
        wait_until(
            lambda: all(client.get(job_id).status == jobs_pb2.JOB_STATUS_SUCCEEDED for job_id in ids),
            30,
            "every job to succeed",
        )

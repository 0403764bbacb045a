"""`examples/go-worker` runs for real: built offline from Debian's Go packages
(examples/go-worker/build) with the committed stubs in generated/go, it runs a
remote kind against a real `leasehold serve` over WorkerService: results,
progress, heartbeats that outlive the lease, a failure, a cancel, and a SIGTERM
that lets the running job finish."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from leasehold.v1 import jobs_pb2
from tests.remote.support import TOKEN
from tests.support import require
from tests.system.helpers import (
    REPO_ROOT,
    Client,
    Leasehold,
    assert_gap_free,
    child_env,
    event_payload,
    types,
)

pytestmark = pytest.mark.slow

EXAMPLE = REPO_ROOT / "examples" / "go-worker"
KIND = "go.steps"
# Leases of 12 s are heartbeated every 4 s: a job of 15 s lives on heartbeats
# alone (two beats may be slow on a busy machine before the lease is lost), and
# a cancel reaches the worker within about 4 s.
LEASE_SECONDS = 12
DEBIAN_GOCODE = Path("/usr/share/gocode/src")


def debian_go_packages() -> bool:
    """grpc and protobuf's sources, and github.com/golang/protobuf of the 1.5 line
    (built on google.golang.org/protobuf; the 1.3 line cannot encode our stubs)."""
    legacy = DEBIAN_GOCODE / "github.com" / "golang" / "protobuf" / "proto" / "buffer.go"
    return (
        (DEBIAN_GOCODE / "google.golang.org" / "grpc").is_dir()
        and (DEBIAN_GOCODE / "google.golang.org" / "protobuf").is_dir()
        and legacy.is_file()
        and "google.golang.org/protobuf" in legacy.read_text()
    )


@pytest.fixture(scope="module")
def go_worker_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`examples/go-worker/build` once per module; Go's build cache lives in the
    repository's git-ignored .cache/ unless GOCACHE says otherwise."""
    require(
        shutil.which("go") is not None and debian_go_packages(),
        "Go and Debian's grpc/protobuf Go packages (apt-get install golang-go golang-google-grpc-dev"
        " golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev)",
    )
    binary = tmp_path_factory.mktemp("go-worker") / "go-worker"
    env = {**os.environ, "GOCACHE": os.environ.get("GOCACHE", str(REPO_ROOT / ".cache" / "go-build"))}
    built = subprocess.run(
        [str(EXAMPLE / "build"), str(binary)], env=env, capture_output=True, text=True, timeout=600
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return binary


@pytest.fixture
def server(tmp_path: Path, processes) -> Leasehold:
    process = processes(
        Leasehold.serve(
            f"sqlite+aiosqlite:///{tmp_path / 'leasehold.db'}",
            "--remote-kinds",
            "go.*",
            "--lease-seconds",
            str(LEASE_SECONDS),
            env={"LEASEHOLD_WORKER_TOKEN": TOKEN},
        )
    )
    process.start()
    return process


def start_worker(binary: Path, port: int, token: str = TOKEN) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(binary), "-server", f"127.0.0.1:{port}", "-grace", "20s"],
        env=child_env({"LEASEHOLD_WORKER_TOKEN": token}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def worker(go_worker_binary: Path, server: Leasehold) -> Iterator[subprocess.Popen[str]]:
    assert server.port is not None
    process = start_worker(go_worker_binary, server.port)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        _, err = process.communicate(timeout=30)
        print(f"go-worker's log:\n{err}")  # shown when the test failed


def log_events(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_the_go_worker_runs_jobs_with_results_and_progress_past_the_lease(
    server: Leasehold, worker: subprocess.Popen[str]
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        # Run at once: one batched heartbeat renews the long job's lease with the others'.
        long = client.enqueue(KIND, {"steps": 10, "step_ms": 1500})
        short = [client.enqueue(KIND, {"steps": n, "step_ms": 50}) for n in (1, 3)]
        default = client.enqueue(KIND)
        for job, steps in [(long, 10), (short[0], 1), (short[1], 3), (default, 3)]:
            done = client.wait_terminal(job.id, timeout=60)
            events = client.all_events(job.id)
            assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED, done
            assert dict(done.result) == {"processed": steps}
            assert done.attempt == 1
            assert_gap_free(events)
            progress = [event_payload(e) for e in events if e.type == "progress"]
            assert progress == [{"step": n} for n in range(1, steps + 1)]
            assert types(events)[:2] == ["job.queued", "job.started"]
            assert types(events)[-1] == "job.succeeded" and "job.lease_expired" not in types(events)


def test_the_go_worker_fails_a_job_whose_payload_it_cannot_use(
    server: Leasehold, worker: subprocess.Popen[str]
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        job = client.enqueue(KIND, {"steps": "many"}, max_attempts=3)
        done = client.wait_terminal(job.id, timeout=30)

    assert done.status == jobs_pb2.JOB_STATUS_FAILED
    assert done.attempt == 1  # non_retryable: no second attempt
    assert '"steps" and "step_ms" must be numbers' in done.error_message


def test_the_go_worker_hears_a_cancel_in_its_heartbeat_and_confirms_it(
    server: Leasehold, worker: subprocess.Popen[str]
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        job = client.enqueue(KIND, {"steps": 600, "step_ms": 100})
        client.events_until(job.id, lambda e: e.type == "progress" and event_payload(e)["step"] == 3)
        client.cancel(job.id)
        done = client.wait_terminal(job.id, timeout=30)
        events = client.all_events(job.id)

    assert done.status == jobs_pb2.JOB_STATUS_CANCELLED
    assert types(events)[-1] == "job.cancelled"
    assert "job.cancel_requested" in types(events) and "job.lease_expired" not in types(events)
    # Ended by the worker's ConfirmCancel within about one heartbeat (4 s), not
    # by the server when the grace (one lease) ran out.
    requested = next(e for e in events if e.type == "job.cancel_requested").created_at.ToDatetime()
    assert (events[-1].created_at.ToDatetime() - requested).total_seconds() < LEASE_SECONDS


def test_sigterm_stops_claiming_and_lets_the_running_job_finish(
    server: Leasehold, worker: subprocess.Popen[str]
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        job = client.enqueue(KIND, {"steps": 10, "step_ms": 300})
        client.events_until(job.id, lambda e: e.type == "progress" and event_payload(e)["step"] == 2)
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
        done = client.get(job.id)

    assert worker.returncode == 0, err
    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert dict(done.result) == {"processed": 10}
    names = [event["event"] for event in log_events(err)]
    assert names.index("worker.stopping") < names.index("job.finished")


def test_the_go_worker_refuses_to_run_with_a_wrong_token(go_worker_binary: Path, server: Leasehold) -> None:
    assert server.port is not None
    process = start_worker(go_worker_binary, server.port, token="not-the-token-at-all")
    _, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert "worker token is not valid" in err

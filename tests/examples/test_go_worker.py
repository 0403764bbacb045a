"""`examples/go-worker` runs for real: built offline from Debian's Go packages
(examples/go-worker/build) with the committed stubs in generated/go, it runs a
remote kind against a real `leasehold serve` over WorkerService protocol 2 with
its fixed handler contract (`sleep_ms`, `echo`, `checkpoint`): results past the
lease, a cancel mid-run, a checkpoint that survives a SIGKILL into attempt 2,
a SIGTERM that lets the running job finish, TLS, and a wrong token."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.credentials import Authority, bearer, token_file
from tests.remote.support import TOKEN
from tests.support import require
from tests.system.helpers import (
    REPO_ROOT,
    Client,
    Leasehold,
    child_env,
    struct,
    types,
    wait_until,
)

pytestmark = pytest.mark.slow

EXAMPLE = REPO_ROOT / "examples" / "go-worker"
KIND = "go.echo"
# The shortest lease serve allows: heartbeats every 2 s, so a job of 9 s lives on
# heartbeats alone and a SIGKILLed worker's lease is recovered within seconds.
LEASE_SECONDS = 6
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


def run_build(*args: str) -> subprocess.CompletedProcess[str]:
    """`examples/go-worker/build ARGS`; Go's build cache lives in the repository's
    git-ignored .cache/ unless GOCACHE says otherwise."""
    require(
        shutil.which("go") is not None and debian_go_packages(),
        "Go and Debian's grpc/protobuf Go packages (apt-get install golang-go golang-google-grpc-dev"
        " golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev)",
    )
    env = {**os.environ, "GOCACHE": os.environ.get("GOCACHE", str(REPO_ROOT / ".cache" / "go-build"))}
    return subprocess.run(
        [str(EXAMPLE / "build"), *args], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def go_worker_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once per module."""
    binary = tmp_path_factory.mktemp("go-worker") / "go-worker"
    built = run_build(str(binary))
    assert built.returncode == 0, built.stderr[-3000:]
    return binary


def test_the_go_unit_tests_pass() -> None:
    """main_test.go, against a fake client: a Complete whose answer was lost
    (UNAVAILABLE) is sent again with the same lease token and its answer accepted;
    ABORTED stops at once; no retry past the lease; the result holds no Value
    without a kind; protocol 1 sends no checkpoint; a job arriving with little
    lease left is renewed at once; two attempts of one job are held apart."""
    tested = run_build("--test")
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]


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


class GoWorker:
    """One go-worker process whose stderr (a JSON object per line) is read as it comes."""

    def __init__(self, binary: Path, *args: str, **env: str) -> None:
        self.process = subprocess.Popen(
            [str(binary), *args],
            env=child_env({"LEASEHOLD_WORKER_TOKEN": TOKEN, "LEASEHOLD_KIND": KIND, **env}),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    @property
    def log(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]

    def wait_for(self, event: str, timeout: float = 30.0, **fields: object) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            for record in self.log:
                if record["event"] == event and all(record.get(k) == v for k, v in fields.items()):
                    return record
            return None

        return wait_until(probe, timeout, f"go-worker to log {event} {fields}")

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        if self.process.poll() is None:
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.wait(10)
        print(f"go-worker's log:\n{''.join(self.lines)}")  # shown when the test failed


@pytest.fixture
def start_worker(go_worker_binary: Path) -> Iterator[Any]:
    started: list[GoWorker] = []

    def start(port: int, *args: str, **env: str) -> GoWorker:
        worker = GoWorker(go_worker_binary, "-server", f"127.0.0.1:{port}", "-grace", "20s", *args, **env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.close()


@pytest.fixture
def worker(server: Leasehold, start_worker) -> GoWorker:
    assert server.port is not None
    return start_worker(server.port)


def result_of(job: jobs_pb2.Job) -> dict[str, Any]:
    return json_format.MessageToDict(job.result)


ECHO = {
    "snake_case_key": {
        "nested_list": [1, "two", None, True, {"deep_snake_key": 3.5}],
        "empty_object": {},
        "null_value": None,
    }
}


def test_a_nested_snake_case_echo_round_trips_and_a_job_outlives_its_lease(
    server: Leasehold, worker: GoWorker
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        # Both run at once: one batched heartbeat keeps the long job's lease alive.
        long = client.enqueue(KIND, {"sleep_ms": 1500 * LEASE_SECONDS, "echo": "long"})
        echo = client.enqueue(KIND, {"echo": ECHO})
        done = client.wait_terminal(echo.id, timeout=30)
        assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED, done
        assert result_of(done) == {"echo": ECHO, "resumed_from": None}

        done = client.wait_terminal(long.id, timeout=60)
        events = client.all_events(long.id)
    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED, done
    assert done.attempt == 1
    assert result_of(done) == {"echo": "long", "resumed_from": None}
    assert "job.lease_expired" not in types(events)
    assert worker.wait_for("worker.started")["protocol"] == 2


def test_a_bad_payload_fails_the_job_without_a_retry(server: Leasehold, worker: GoWorker) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        job = client.enqueue(KIND, {"sleep_ms": "long"}, max_attempts=3)
        done = client.wait_terminal(job.id, timeout=30)
    assert done.status == jobs_pb2.JOB_STATUS_FAILED
    assert done.attempt == 1  # non_retryable
    assert '"sleep_ms" must be a number' in done.error_message


def test_a_cancel_mid_run_is_confirmed_by_the_worker(server: Leasehold, worker: GoWorker) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        job = client.enqueue(KIND, {"sleep_ms": 60_000})
        worker.wait_for("job.started", job_id=job.id)
        client.cancel(job.id)
        # The waiting Claim names the held lease, so the news comes within
        # milliseconds; the bound is the server's own grace (one lease), after
        # which the server would end the job without the worker.
        done = client.wait_terminal(job.id, timeout=LEASE_SECONDS)
    assert done.status == jobs_pb2.JOB_STATUS_CANCELLED
    assert done.attempt == 1
    finished = worker.wait_for("job.finished", job_id=job.id)
    assert finished["outcome"] == "cancelled"  # its ConfirmCancel was recorded


def test_a_checkpoint_reaches_the_next_attempt_after_a_sigkill(server: Leasehold, start_worker) -> None:
    assert server.port is not None
    checkpoint = {"rows_done": 40, "cursor_key": "k-40"}
    first = start_worker(server.port)
    with Client(server.port) as client:
        job = client.enqueue(
            KIND,
            {"sleep_ms": 4000, "checkpoint": checkpoint, "echo": "again"},
            max_attempts=3,
            retry_policy=jobs_pb2.RetryPolicy(initial_interval_seconds=0.1),
        )
        first.wait_for("job.checkpointed", job_id=job.id, attempt=1)
        first.process.kill()  # mid-sleep: no finishing write, the lease runs out
        first.wait(10)
        second = start_worker(server.port)
        done = client.wait_terminal(job.id, timeout=45)
    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED, done
    assert done.attempt == 2
    assert result_of(done) == {"echo": "again", "resumed_from": checkpoint}
    assert second.wait_for("job.finished", job_id=job.id)["outcome"] == "completed"


def test_sigterm_stops_claiming_lets_the_running_job_finish_and_exits_0(
    server: Leasehold, worker: GoWorker
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        job = client.enqueue(KIND, {"sleep_ms": 2000, "echo": 1})
        worker.wait_for("job.started", job_id=job.id)
        worker.process.send_signal(signal.SIGTERM)
        worker.wait_for("worker.stopping")
        later = client.enqueue(KIND, {"echo": 2})  # no longer claimed
        assert worker.wait(30) == 0
        done = client.get(job.id)
        left = client.get(later.id)
    assert left.status == jobs_pb2.JOB_STATUS_QUEUED and left.attempt == 0
    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert result_of(done) == {"echo": 1, "resumed_from": None}
    names = [record["event"] for record in worker.log]
    assert names.index("worker.stopping") < names.index("job.finished") < names.index("worker.stopped")


def test_the_go_worker_refuses_to_run_with_a_wrong_token(server: Leasehold, start_worker) -> None:
    assert server.port is not None
    worker = start_worker(server.port, LEASEHOLD_WORKER_TOKEN="not-the-token-at-all")
    assert worker.wait(30) == 2
    assert "worker token is not valid" in "".join(worker.lines)


def test_the_go_worker_over_tls_trusting_leasehold_tls_ca(tmp_path: Path, processes, start_worker) -> None:
    authority = Authority(tmp_path)
    cert = authority.server()
    path, (owner, worker_token) = token_file(tmp_path / "tokens", "owner:go-test", "worker:go.*")
    server = processes(
        Leasehold.serve(
            f"sqlite+aiosqlite:///{tmp_path / 'leasehold.db'}",
            "--remote-kinds",
            "go.*",
            "--auth",
            "token",
            "--token-file",
            str(path),
            "--tls-cert",
            str(cert.cert_file),
            "--tls-key",
            str(cert.key_file),
        )
    )
    port = server.start()
    worker = start_worker(
        port,
        LEASEHOLD_WORKER_TOKEN=worker_token,
        LEASEHOLD_TLS_CA=str(authority.cert_file),
    )
    credentials = grpc.ssl_channel_credentials(authority.cert)
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        request = jobs_pb2.EnqueueRequest(kind=KIND, payload=struct({"echo": "over tls"}))
        job = stub.Enqueue(request, metadata=bearer(owner), timeout=10).job

        def finished() -> jobs_pb2.Job | None:
            got = stub.Get(jobs_pb2.GetRequest(job_id=job.id), metadata=bearer(owner), timeout=10).job
            return got if got.status == jobs_pb2.JOB_STATUS_SUCCEEDED else None

        done = wait_until(finished, 30, "the job to succeed over TLS")
    assert result_of(done) == {"echo": "over tls", "resumed_from": None}
    assert worker.wait_for("worker.started")["protocol"] == 2
    assert worker_token not in server.output

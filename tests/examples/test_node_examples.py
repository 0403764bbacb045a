"""The Node.js examples run for real: `examples/node-client` enqueues and watches
a job through a deliberate disconnect, `examples/node-worker` runs a remote kind
end to end over WorkerService (progress, heartbeats, cancel, a result), each
against a real `leasehold serve`. `npm ci` installs their pinned dependencies."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from leasehold.v1 import jobs_pb2
from tests.credentials import Authority, token_file
from tests.remote.support import TOKEN
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

EXAMPLES = REPO_ROOT / "examples"
KIND = "node.steps"


@pytest.fixture(scope="module")
def node_examples() -> Path:
    """`npm ci` once for both examples (one workspace, one lock file)."""
    npm = shutil.which("npm")
    assert npm is not None and shutil.which("node"), "Node.js and npm are required for the examples"
    installed = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return EXAMPLES


@pytest.fixture
def server(tmp_path: Path, processes) -> Leasehold:
    process = processes(
        Leasehold.serve(
            f"sqlite+aiosqlite:///{tmp_path / 'leasehold.db'}",
            "--remote-kinds",
            "node.*",
            env={"LEASEHOLD_WORKER_TOKEN": TOKEN},
        )
    )
    process.start()
    return process


def node(script: Path, *args: str, port: int, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["node", str(script), *args],
        cwd=script.parent,
        env=child_env({"LEASEHOLD_SERVER": f"127.0.0.1:{port}", **env}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def node_worker(node_examples: Path, server: Leasehold) -> Iterator[subprocess.Popen[str]]:
    assert server.port is not None
    process = node(
        node_examples / "node-worker" / "worker.js", port=server.port, LEASEHOLD_WORKER_TOKEN=TOKEN
    )
    try:
        yield process
    finally:
        process.terminate()
        process.communicate(timeout=15)


def test_the_node_client_watches_a_job_through_a_disconnect_without_a_gap_or_a_duplicate(
    node_examples: Path, server: Leasehold
) -> None:
    assert server.port is not None
    client = node(
        node_examples / "node-client" / "client.js",
        "example.sleep",
        json.dumps({"seconds": 1, "steps": 4}),
        "--disconnect-after",
        "3",
        port=server.port,
        LEASEHOLD_OWNER="node-test",
    )
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    events = [line for line in lines if "sequence" in line]
    assert [event["sequence"] for event in events] == list(range(1, len(events) + 1))
    assert {"disconnected": True, "resume_after_sequence": 3} in lines
    assert lines.index({"disconnected": True, "resume_after_sequence": 3}) == 3  # after three events
    assert [event["type"] for event in events if event["type"] == "progress"] == ["progress"] * 4
    assert events[-1]["type"] == "job.succeeded"
    assert lines[-1]["status"] == "JOB_STATUS_SUCCEEDED"


def test_the_node_worker_runs_a_remote_kind_end_to_end(
    server: Leasehold, node_worker: subprocess.Popen[str]
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        job = client.enqueue(KIND, {"steps": 3, "step_ms": 50})
        done = client.wait_terminal(job.id, timeout=30)
        events = client.all_events(job.id)

    assert done.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert dict(done.result) == {"processed": 3}
    assert_gap_free(events)
    assert [event_payload(e) for e in events if e.type == "progress"] == [
        {"step": 1},
        {"step": 2},
        {"step": 3},
    ]
    assert types(events)[:2] == ["job.queued", "job.started"] and types(events)[-1] == "job.succeeded"


def test_the_node_worker_hears_a_cancel_in_its_heartbeat_and_confirms_it(
    server: Leasehold, node_worker: subprocess.Popen[str]
) -> None:
    assert server.port is not None
    with Client(server.port) as client:
        # A job that would run a minute: the cancel reaches the worker only in a
        # heartbeat reply (every lease/3 = 10 s), and the worker confirms it.
        job = client.enqueue(KIND, {"steps": 600, "step_ms": 100})
        client.events_until(job.id, lambda e: e.type == "progress" and event_payload(e)["step"] == 3)
        client.cancel(job.id)
        done = client.wait_terminal(job.id, timeout=30)
        events = client.all_events(job.id)

    assert done.status == jobs_pb2.JOB_STATUS_CANCELLED
    assert types(events)[-1] == "job.cancelled"
    assert "job.cancel_requested" in types(events) and "job.lease_expired" not in types(events)
    # Ended by the worker's ConfirmCancel within about one heartbeat (10 s),
    # not by the server when the grace (one lease, 30 s) ran out.
    requested = next(e for e in events if e.type == "job.cancel_requested").created_at.ToDatetime()
    ended = events[-1].created_at.ToDatetime()
    assert (ended - requested).total_seconds() < 20


def test_the_node_worker_refuses_to_run_with_a_wrong_token(node_examples: Path, server: Leasehold) -> None:
    assert server.port is not None
    process = node(
        node_examples / "node-worker" / "worker.js",
        port=server.port,
        LEASEHOLD_WORKER_TOKEN="not-the-token-at-all",
    )
    _, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert "worker token is not valid" in err


def test_both_examples_work_over_tls_with_tokens(node_examples: Path, tmp_path: Path, processes) -> None:
    """LEASEHOLD_TLS_CA turns TLS on; under `--auth token` the client sends
    LEASEHOLD_TOKEN and the worker its own worker token."""
    authority = Authority(tmp_path)
    cert = authority.server()
    path, (owner, worker) = token_file(tmp_path / "tokens", "owner:node-test", "worker:node.*")
    server = processes(
        Leasehold.serve(
            f"sqlite+aiosqlite:///{tmp_path / 'leasehold.db'}",
            "--remote-kinds",
            "node.*",
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
    tls = {"LEASEHOLD_TLS_CA": str(authority.cert_file)}
    worker_process = node(
        node_examples / "node-worker" / "worker.js", port=port, LEASEHOLD_WORKER_TOKEN=worker, **tls
    )
    try:
        client = node(
            node_examples / "node-client" / "client.js",
            KIND,
            json.dumps({"steps": 2, "step_ms": 50}),
            port=port,
            LEASEHOLD_TOKEN=owner,
            **tls,
        )
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        assert json.loads(out.splitlines()[-1]) == {
            "status": "JOB_STATUS_SUCCEEDED",
            "result": {"processed": 2},
        }
    finally:
        worker_process.terminate()
        worker_process.communicate(timeout=15)
    # Plaintext to the TLS port fails instead of sending the token in the clear.
    plain = node(node_examples / "node-client" / "client.js", KIND, port=port, LEASEHOLD_TOKEN=owner)
    _, err = plain.communicate(timeout=60)
    assert plain.returncode != 0
    assert owner not in server.output and worker not in server.output

"""A real `leasehold serve` process in token and JWT mode: SIGHUP re-reads the
token file (a revoked token stops working, a bad file keeps the old set) and
the JWT keys (a key rollover), and no token, JWT or secret ever reaches its
logs. Also `leasehold token create` and a bad token file at start-up."""

from __future__ import annotations

import hashlib
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.auth.secret_handlers import RESULT_PLANT
from tests.credentials import AUDIENCE, HS256_SECRET, ISSUER, Signer, bearer, token_file
from tests.support import sqlite_url
from tests.system.helpers import Leasehold, run_cli, wait_until

pytestmark = pytest.mark.slow
PLANTED = "lh_PLANTED-never-to-be-logged-0123456789"


def _code(port: int, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            jobs_pb2_grpc.JobServiceStub(channel).List(jobs_pb2.ListRequest(), metadata=metadata, timeout=10)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return,attr-defined]
    return grpc.StatusCode.OK


def _hup_and_wait(server: Leasehold, event: str) -> dict[str, object]:
    seen = len(server.events(event))
    assert server.process is not None
    server.process.send_signal(signal.SIGHUP)
    return wait_until(
        lambda: server.events(event)[seen] if len(server.events(event)) > seen else None, 15, event
    )


def test_sighup_revokes_a_token_and_a_bad_file_keeps_the_old_set(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    path, (alice, bob) = token_file(tmp_path / "tokens", "owner:alice", "owner:bob")
    server = processes(Leasehold.serve(sqlite_url(tmp_path), "--auth", "token", "--token-file", str(path)))
    port = server.start()
    assert [_code(port, bearer(t)) for t in (alice, bob, PLANTED)] == [
        grpc.StatusCode.OK,
        grpc.StatusCode.OK,
        grpc.StatusCode.UNAUTHENTICATED,
    ]

    # Revoke bob: drop his line, then SIGHUP.
    path.write_text("\n".join(line for line in path.read_text().splitlines() if "owner:bob" not in line))
    assert _hup_and_wait(server, "auth.token_file_reloaded")["tokens"] == 1
    assert _code(port, bearer(bob)) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(port, bearer(alice)) == grpc.StatusCode.OK

    # A raw token pasted on line 4 (after the comment, a blank and alice's line):
    # the file is refused, and the old set stays.
    path.write_text(path.read_text() + f"\n{PLANTED} owner:mallory\n")
    failed = _hup_and_wait(server, "auth.token_file_reload_failed")
    assert failed["error"] == f"token_file: {path}, line 4: expected 'sha256:<64 lowercase hex digits> ROLE'"
    assert _code(port, bearer(alice)) == grpc.StatusCode.OK
    assert _code(port, bearer(bob)) == grpc.StatusCode.UNAUTHENTICATED

    server.interrupt()
    assert server.returncode == 0
    for secret in (alice, bob, PLANTED):
        assert secret not in server.output
    assert server.started.record["auth"] == "token"


def test_jwt_keys_roll_over_on_sighup_and_no_jwt_or_secret_is_logged(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    old = Signer(tmp_path, "HS256")
    new_key = tmp_path / "new.pem"
    new = Signer(tmp_path, "ES256")
    new_key.write_bytes(new.public)
    key_file = tmp_path / "keys"
    key_file.write_bytes(old.public)
    server = processes(
        Leasehold.serve(
            sqlite_url(tmp_path),
            "--auth",
            "jwt",
            "--jwt-key-file",
            str(key_file),
            env={"LEASEHOLD_JWT_ISSUER": ISSUER, "LEASEHOLD_JWT_AUDIENCE": AUDIENCE},
        )
    )
    port = server.start()
    old_token, new_token = old.token(), new.token()
    planted = old.token(aud="somewhere-else", planted=PLANTED)
    assert _code(port, bearer(old_token)) == grpc.StatusCode.OK
    assert _code(port, bearer(new_token)) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(port, bearer(planted)) == grpc.StatusCode.UNAUTHENTICATED

    key_file.write_bytes(new.public)  # the identity provider moved to the new key
    assert _hup_and_wait(server, "auth.jwt_key_file_reloaded")["keys"] == 1
    assert _code(port, bearer(new_token)) == grpc.StatusCode.OK
    assert _code(port, bearer(old_token)) == grpc.StatusCode.UNAUTHENTICATED

    server.interrupt()
    for secret in (old_token, new_token, planted, PLANTED, HS256_SECRET):
        assert secret not in server.output


def test_token_create_prints_a_token_and_the_line_granting_it() -> None:
    result = run_cli("token", "create", "worker:media.*,report.x")
    assert result.returncode == 0, result.stderr
    token, line = result.stdout.splitlines()
    assert token.startswith("lh_") and len(token) > 40
    assert line == f"sha256:{hashlib.sha256(token.encode()).hexdigest()} worker:media.*,report.x"
    assert token not in result.stderr
    again = run_cli("token", "create", "worker:media.*,report.x").stdout.splitlines()[0]
    assert again != token


@pytest.mark.parametrize("role", ["root", "owner:", "owner:has space", "worker:Bad*", "admin:x"])
def test_token_create_refuses_a_role_that_is_not_one(role: str) -> None:
    result = run_cli("token", "create", role)
    assert result.returncode == 2
    assert result.stderr.startswith("leasehold: role: a role is owner:<id>, worker")
    assert result.stdout == ""


def test_a_bad_token_file_stops_serve_naming_the_line_not_the_secret(tmp_path: Path) -> None:
    path, _ = token_file(tmp_path / "tokens", "owner:alice")
    path.write_text(path.read_text() + f"sha256:{'0' * 64} owner:{PLANTED}!\n")
    result = run_cli(
        "serve", "--database-url", sqlite_url(tmp_path), "--auth", "token", "--token-file", str(path)
    )
    assert result.returncode == 2
    assert result.stderr == f"leasehold: token_file: {path}, line 4: ROLE must be owner:<id>, worker, " + (
        "worker:<kind pattern>,... or admin\n"
    )
    missing = run_cli("serve", "--auth", "token", "--token-file", str(tmp_path / "absent"))
    assert missing.returncode == 2
    assert missing.stderr == f"leasehold: token_file: cannot read {tmp_path / 'absent'}: FileNotFoundError\n"


def test_no_token_jwt_payload_or_result_reaches_the_logs_or_the_metrics(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    """DESIGN §13: a real serve in JWT mode, logging at debug, with /metrics on.
    A job's payload and its result, the caller's JWT and a refused JWT are each
    planted with a string of their own; none appears in the process's output or
    in the metrics text, which still counts the job (so it was scraped after the
    work, not before)."""
    signer = Signer(tmp_path, "HS256")
    server = processes(
        Leasehold.serve(
            sqlite_url(tmp_path),
            "--auth",
            "jwt",
            "--jwt-key-file",
            str(tmp_path / "keys"),
            "--metrics-listen",
            "127.0.0.1:0",
            "--log-level",
            "debug",
            "--handlers",
            "tests.auth.secret_handlers",
            env={"LEASEHOLD_JWT_ISSUER": ISSUER, "LEASEHOLD_JWT_AUDIENCE": AUDIENCE},
        )
    )
    (tmp_path / "keys").write_bytes(signer.public)
    port = server.start()
    owner_jwt = signer.token(planted=PLANTED)
    refused_jwt = signer.token(aud="somewhere-else", planted=PLANTED)
    payload_plant = "payload-PLANTED-never-to-be-logged-77a0"
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        request = jobs_pb2.EnqueueRequest(kind="test.answer")
        request.payload.update({"note": payload_plant})
        job = stub.Enqueue(request, metadata=bearer(owner_jwt), timeout=10).job
        watch = jobs_pb2.WatchEventsRequest(job_id=job.id)
        events = [r.event.type for r in stub.WatchEvents(watch, metadata=bearer(owner_jwt), timeout=30)]
        assert events[-1] == "job.succeeded"
        finished = stub.Get(jobs_pb2.GetRequest(job_id=job.id), metadata=bearer(owner_jwt), timeout=10).job
        assert RESULT_PLANT in str(finished.result)  # the result is there to be leaked
    assert _code(port, bearer(refused_jwt)) == grpc.StatusCode.UNAUTHENTICATED

    metrics_url = str(server.started.metrics)
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        metrics_text = response.read().decode()
    finished_counts = {
        (sample.labels.get("kind"), sample.labels.get("status")): sample.value
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "leasehold_jobs_finished"
        for sample in family.samples
        if sample.name == "leasehold_jobs_finished_total"
    }
    assert finished_counts[("test.answer", "succeeded")] == 1

    server.interrupt()
    assert server.events_for("job.completed", job.id)  # the job was logged, and the calls with it
    for secret in (owner_jwt, refused_jwt, PLANTED, payload_plant, RESULT_PLANT, HS256_SECRET):
        assert secret not in server.output
        assert secret not in metrics_text

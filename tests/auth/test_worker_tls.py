"""`leasehold worker` over TLS: with a client certificate (`--auth mtls`, no
token), and over server TLS with a token; its flags are checked up front."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from leasehold._server.auth.settings import AuthSettings
from leasehold._server.cli import main
from leasehold._server.cli.worker import WorkerSettings, tls_credentials
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from leasehold.worker import HandlerRegistry, JobContext, Worker
from tests.auth.helpers import Metadata, connect, enqueue, serving
from tests.credentials import Authority, bearer, token_file

KIND = "media.resize"


def _registry() -> HandlerRegistry:
    registry = HandlerRegistry()

    async def resize(ctx: JobContext) -> dict[str, object]:
        return {"resized": True}

    registry.register(KIND, resize)
    return registry


async def _run_one_job(worker: Worker, channel: grpc.aio.Channel, metadata: Metadata) -> jobs_pb2.Job:
    """Enqueue a job for `worker`, run the worker until the job's log ends."""
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    job = (await enqueue(channel, metadata, KIND)).job
    run = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(15):
            watch = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job.id), metadata=metadata)
            assert "job.succeeded" in [response.event.type async for response in watch]
    finally:
        await worker.stop()
        await run
    return (await stub.Get(jobs_pb2.GetRequest(job_id=job.id), metadata=metadata)).job


async def test_a_worker_with_a_client_certificate_needs_no_token(tmp_path: Path) -> None:
    authority = Authority(tmp_path)
    server = authority.server()
    auth = AuthSettings(
        mode="mtls",
        tls_cert=str(server.cert_file),
        tls_key=str(server.key_file),
        tls_client_ca=str(authority.cert_file),
    )
    worker_cert = authority.client("transcoder", "leasehold:worker:media.*")
    settings = WorkerSettings(
        server="",
        handler_modules=(),
        token=None,
        tls_ca=str(authority.cert_file),
        tls_client_cert=str(worker_cert.cert_file),
        tls_client_key=str(worker_cert.key_file),
    )
    async with serving(tmp_path, auth) as app:
        worker = Worker(
            f"localhost:{app.port}",
            _registry(),
            None,
            credentials=tls_credentials(settings),
            stop_grace_seconds=0,
        )
        async with connect(app, ca=authority.cert, client=authority.client("alice")) as channel:
            job = await _run_one_job(worker, channel, ())
    assert job.status == jobs_pb2.JOB_STATUS_SUCCEEDED


async def test_a_worker_with_a_token_over_server_tls(tmp_path: Path) -> None:
    authority = Authority(tmp_path)
    server = authority.server()
    path, (owner, worker_token) = token_file(tmp_path / "tokens", "owner:alice", "worker:media.*")
    auth = AuthSettings(
        mode="token", token_file=str(path), tls_cert=str(server.cert_file), tls_key=str(server.key_file)
    )
    settings = WorkerSettings(
        server="", handler_modules=(), token=worker_token, tls_ca=str(authority.cert_file)
    )
    async with serving(tmp_path, auth) as app:
        worker = Worker(
            f"localhost:{app.port}",
            _registry(),
            worker_token,
            credentials=tls_credentials(settings),
            stop_grace_seconds=0,
        )
        async with connect(app, ca=authority.cert) as channel:
            job = await _run_one_job(worker, channel, bearer(owner))
    assert job.status == jobs_pb2.JOB_STATUS_SUCCEEDED


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--tls-client-cert", "c.pem"],
            "tls_client_cert: --tls-client-cert and --tls-client-key go together",
        ),
        (
            ["--tls-client-cert", "c.pem", "--tls-client-key", "k.pem"],
            "tls_ca: a client certificate needs --tls-ca",
        ),
        ([], "LEASEHOLD_WORKER_TOKEN: must be set to the worker's token (or give --tls-client-cert)"),
        (["--tls-ca", "/nonexistent/ca.pem"], "tls_ca: cannot read /nonexistent/ca.pem: FileNotFoundError"),
    ],
)
def test_bad_tls_flags_are_one_line_naming_the_flag(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "LEASEHOLD_WORKER_TOKEN",
        "LEASEHOLD_TLS_CA",
        "LEASEHOLD_TLS_CLIENT_CERT",
        "LEASEHOLD_TLS_CLIENT_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    if args[:1] == ["--tls-ca"]:
        monkeypatch.setenv("LEASEHOLD_WORKER_TOKEN", "a-worker-token-of-enough-length")
    code = main.main(["worker", "--server", "127.0.0.1:1", "--handlers", "leasehold.examples", *args])
    assert code == 2
    assert capsys.readouterr().err.startswith(f"leasehold: {message}")

"""Open streams end when their credential does: a token taken out of the token
file (then SIGHUP, `reload_credentials` in process) and a JWT reaching its
`exp` (plus the leeway) end the caller's open WatchEvents with UNAUTHENTICATED
at once, rather than after the job's next event, which here would be ten
minutes away. Another owner's stream, whose credential still passes, goes on,
and a stream resumed with a fresh credential from its last event misses
nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from leasehold._server.auth.settings import AuthSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.auth.helpers import connect, serving
from tests.credentials import AUDIENCE, ISSUER, Signer, bearer, new_token

# Far longer than a wait here: a stream that ends must end through its credential.
QUIET_JOB = {"seconds": 600, "steps": 1}
WAIT = 20.0


def _sleep_job(stub: jobs_pb2_grpc.JobServiceStub, metadata: tuple[tuple[str, str], ...]) -> object:
    payload = struct_pb2.Struct()
    payload.update(QUIET_JOB)
    return stub.Enqueue(jobs_pb2.EnqueueRequest(kind="example.sleep", payload=payload), metadata=metadata)


async def _started(stream: grpc.aio.UnaryStreamCall) -> list[jobs_pb2.JobEvent]:
    seen = []
    async with asyncio.timeout(WAIT):
        while not seen or seen[-1].type != "job.started":
            seen.append((await stream.read()).event)
    return seen


async def _ends_unauthenticated(stream: grpc.aio.UnaryStreamCall) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async with asyncio.timeout(WAIT):
            while True:
                response = await stream.read()
                assert response is not grpc.aio.EOF, "the stream ended OK"
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value
    return ended.value


async def test_a_token_taken_out_of_the_file_ends_its_open_stream(tmp_path: Path) -> None:
    alice, alice_line = new_token("owner:alice")
    bob, bob_line = new_token("owner:bob")
    path = tmp_path / "tokens"
    path.write_text(f"{alice_line}\n{bob_line}\n")
    async with (
        serving(tmp_path, AuthSettings(mode="token", token_file=str(path))) as app,
        connect(app) as channel,
    ):
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        streams = {}
        for name, token in (("alice", alice), ("bob", bob)):
            job = (await _sleep_job(stub, bearer(token))).job
            stream = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job.id), metadata=bearer(token))
            streams[name] = (job, stream, await _started(stream))

        path.write_text(f"{alice_line}\n")  # bob's token is revoked
        app.reload_credentials()

        err = await _ends_unauthenticated(streams["bob"][1])
        assert bob not in (err.details() or "")  # the refusal never echoes the token
        assert app.stream_credentials.open == 1
        # Alice's stream is untouched: it still delivers her job's next event.
        job, stream, seen = streams["alice"]
        await stub.Cancel(jobs_pb2.CancelRequest(job_id=job.id), metadata=bearer(alice))
        async with asyncio.timeout(WAIT):
            following = (await stream.read()).event
        assert (following.sequence, following.type) == (seen[-1].sequence + 1, "job.cancel_requested")


async def test_a_jwt_that_expires_ends_its_open_stream_and_a_fresh_one_resumes(tmp_path: Path) -> None:
    signer = Signer(tmp_path, "RS256")
    settings = AuthSettings(
        mode="jwt", jwt_key_file=str(signer.key_file), jwt_issuer=ISSUER, jwt_audience=AUDIENCE
    )
    # The server allows 30 s of leeway past exp: this one is good for about two more seconds.
    expiring = signer.token(exp=int(time.time()) - 28)
    async with serving(tmp_path, settings) as app, connect(app) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        job = (await _sleep_job(stub, bearer(expiring))).job
        stream = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job.id), metadata=bearer(expiring))
        seen = await _started(stream)

        err = await _ends_unauthenticated(stream)
        assert "expired" in (err.details() or "")

        fresh = signer.token()
        await stub.Cancel(jobs_pb2.CancelRequest(job_id=job.id), metadata=bearer(fresh))
        resumed = stub.WatchEvents(
            jobs_pb2.WatchEventsRequest(job_id=job.id, after_sequence=seen[-1].sequence),
            metadata=bearer(fresh),
        )
        async with asyncio.timeout(WAIT):
            following = (await resumed.read()).event
        assert (following.sequence, following.type) == (seen[-1].sequence + 1, "job.cancel_requested")
        resumed.cancel()

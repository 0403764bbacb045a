"""Existence never leaks under token and JWT auth either: another owner's job
and an id nobody has are denied with the same bytes on the wire, as
tests/api/test_existence.py shows for the trusted header."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from leasehold._server.auth.settings import AuthSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import drain, expect_error
from tests.api.test_existence import RPCS, UNKNOWN_ID, _with_id
from tests.auth.helpers import Metadata, connect, enqueue, serving
from tests.credentials import AUDIENCE, ISSUER, Signer, bearer, token_file


def _call(stub: jobs_pb2_grpc.JobServiceStub, rpc: str, job_id: str, metadata: Metadata) -> Any:
    if rpc == "Get":
        return stub.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=metadata)
    if rpc == "Cancel":
        return stub.Cancel(jobs_pb2.CancelRequest(job_id=job_id), metadata=metadata)
    if rpc == "Retry":
        return stub.Retry(jobs_pb2.RetryRequest(job_id=job_id), metadata=metadata)
    return drain(stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id), metadata=metadata))


async def _denied(
    stub: jobs_pb2_grpc.JobServiceStub, rpc: str, job_id: str, metadata: Metadata
) -> dict[str, Any]:
    err = await expect_error(_call(stub, rpc, job_id, metadata), grpc.StatusCode.PERMISSION_DENIED)
    assert err.details() == f"job {job_id} not found or not accessible"
    return {
        "code": err.code(),
        "details": err.details(),
        "initial": list(err.initial_metadata() or ()),
        "trailing": list(err.trailing_metadata() or ()),
    }


def _token_mode(directory: Path) -> tuple[AuthSettings, Callable[[str], Metadata]]:
    owners = ("alice", "bob", "carol")
    path, tokens = token_file(directory / "tokens", *(f"owner:{owner}" for owner in owners))
    by_owner = dict(zip(owners, tokens, strict=True))
    return AuthSettings(mode="token", token_file=str(path)), lambda owner: bearer(by_owner[owner])


def _jwt_mode(directory: Path) -> tuple[AuthSettings, Callable[[str], Metadata]]:
    signer = Signer(directory, "ES256")
    settings = AuthSettings(
        mode="jwt", jwt_key_file=str(signer.key_file), jwt_issuer=ISSUER, jwt_audience=AUDIENCE
    )
    return settings, lambda owner: bearer(signer.token(sub=owner))


@pytest.mark.parametrize("mode", [_token_mode, _jwt_mode], ids=["token", "jwt"])
async def test_foreign_and_unknown_jobs_are_denied_byte_identically(tmp_path: Path, mode) -> None:
    settings, as_owner = mode(tmp_path)
    async with serving(tmp_path, settings) as app, connect(app) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        job = (await enqueue(channel, as_owner("alice"), "media.resize")).job  # queued: no remote worker
        for rpc in RPCS:
            foreign = await _denied(stub, rpc, job.id, as_owner("bob"))
            unknown = await _denied(stub, rpc, UNKNOWN_ID, as_owner("bob"))
            assert any(key == "grpc-status-details-bin" for key, _ in foreign["trailing"])
            assert foreign == _with_id(unknown, UNKNOWN_ID, job.id), rpc
            assert await _denied(stub, rpc, job.id, as_owner("carol")) == foreign, rpc
        # The owner still has it, untouched by the probes.
        got = await stub.Get(jobs_pb2.GetRequest(job_id=job.id), metadata=as_owner("alice"))
        assert got.job.status == jobs_pb2.JOB_STATUS_QUEUED

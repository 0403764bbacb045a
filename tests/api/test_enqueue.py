"""Enqueue over gRPC: defaults, limits and per-resource idempotency (DESIGN §2, §3 Dedup)."""

from __future__ import annotations

import asyncio
import re

from leasehold.v1 import jobs_pb2
from tests.api.helpers import enqueue, get_job, list_all, start_gate_job, wait_for_terminal
from tests.support import OTHER_OWNER, OWNER, owner_metadata

JOB_ID = re.compile(r"job_[0-9a-f]{32}")


async def test_enqueue_applies_defaults_and_returns_a_queued_job(stub, app):
    response = await enqueue(stub, "example.echo", {"secret": "s3cr3t-payload-value"})

    job = response.job
    assert response.created is True
    assert JOB_ID.fullmatch(job.id), job.id
    assert job.kind == "example.echo"
    assert job.status == jobs_pb2.JOB_STATUS_QUEUED
    assert job.attempt == 0
    assert job.max_attempts == 3
    assert job.timeout_seconds == 900
    assert job.resource_type == "" and job.resource_id == ""
    assert job.retry_of_job_id == "" and job.error_message == ""
    for stamp in ("created_at", "updated_at", "available_at"):
        assert job.HasField(stamp), stamp
    for stamp in ("started_at", "completed_at", "cancel_requested_at"):
        assert not job.HasField(stamp), stamp
    assert job.available_at == job.created_at
    assert job.created_at.ToDatetime().year >= 2024


async def test_job_never_exposes_payload_or_lease(stub, app):
    exposed = set(jobs_pb2.Job.DESCRIPTOR.fields_by_name)
    assert not exposed & {"payload", "lease_owner", "lease_token", "lease_expires_at"}

    job = await start_gate_job(stub, {"secret": "s3cr3t-payload-value"})
    # The owner is named (AdminService lists across owners), and on JobService
    # it is only ever the caller itself.
    assert job.owner_id == OWNER
    # Running: a lease exists now, and still nothing of it (or the payload) is on the wire.
    listed = await list_all(stub)
    assert [listed_job.id for listed_job in listed] == [job.id]
    for message in (job, *listed):
        assert b"s3cr3t-payload-value" not in message.SerializeToString()


async def test_explicit_limits_are_kept_at_their_bounds(stub, app):
    low = await enqueue(stub, max_attempts=1, timeout_seconds=1)
    high = await enqueue(stub, max_attempts=100, timeout_seconds=86_400)
    assert (low.job.max_attempts, low.job.timeout_seconds) == (1, 1)
    assert (high.job.max_attempts, high.job.timeout_seconds) == (100, 86_400)
    assert (await get_job(stub, high.job.id)).max_attempts == 100


async def test_resource_fields_up_to_256_characters_are_accepted(stub, app):
    response = await enqueue(stub, resource_type="t" * 256, resource_id="i" * 256)
    assert response.created
    assert response.job.resource_type == "t" * 256
    assert response.job.resource_id == "i" * 256


async def test_repeated_enqueue_of_a_resource_returns_the_same_job(stub, app):
    first = await enqueue(stub, resource_type="doc", resource_id="42", payload={"v": 1})
    second = await enqueue(stub, resource_type="doc", resource_id="42", payload={"v": 2})

    assert first.created is True
    assert second.created is False
    assert second.job.id == first.job.id
    assert second.job.created_at == first.job.created_at
    assert [job.id for job in await list_all(stub)] == [first.job.id]


async def test_repeated_enqueue_returns_the_current_state_of_the_job(stub, app):
    first = await enqueue(stub, "example.echo", resource_type="doc", resource_id="done")
    finished = await wait_for_terminal(stub, first.job.id)

    again = await enqueue(stub, "example.echo", resource_type="doc", resource_id="done")

    assert again.created is False
    assert again.job == finished
    assert again.job.status == jobs_pb2.JOB_STATUS_SUCCEEDED


async def test_twenty_concurrent_enqueues_of_a_resource_create_exactly_one_job(stub, app):
    responses = await asyncio.gather(
        *(enqueue(stub, resource_type="doc", resource_id="race") for _ in range(20))
    )

    assert sum(response.created for response in responses) == 1
    assert len({response.job.id for response in responses}) == 1
    stored = await list_all(stub, resource_type="doc", resource_id="race")
    assert [job.id for job in stored] == [responses[0].job.id]


async def test_same_resource_of_different_owners_is_not_deduplicated(stub, app):
    mine = await enqueue(stub, resource_type="doc", resource_id="42", owner=OWNER)
    theirs = await enqueue(stub, resource_type="doc", resource_id="42", owner=OTHER_OWNER)

    assert mine.created and theirs.created
    assert mine.job.id != theirs.job.id


async def test_dedup_key_includes_the_resource_type(stub, app):
    doc = await enqueue(stub, resource_type="doc", resource_id="42")
    image = await enqueue(stub, resource_type="image", resource_id="42")

    assert doc.created and image.created
    assert doc.job.id != image.job.id


async def test_no_dedup_without_resource_id(stub, app):
    bare = [await enqueue(stub) for _ in range(2)]
    typed = [await enqueue(stub, resource_type="doc") for _ in range(2)]

    assert all(response.created for response in (*bare, *typed))
    assert len({response.job.id for response in (*bare, *typed)}) == 4


async def test_enqueue_after_a_manual_retry_returns_the_newest_job_of_the_resource(stub, app):
    root = await enqueue(
        stub, "example.fail", {"message": "boom"}, resource_type="doc", resource_id="7", max_attempts=1
    )
    assert (await wait_for_terminal(stub, root.job.id)).status == jobs_pb2.JOB_STATUS_FAILED
    child = await stub.Retry(jobs_pb2.RetryRequest(job_id=root.job.id), metadata=owner_metadata())

    again = await enqueue(stub, "example.fail", {"message": "boom"}, resource_type="doc", resource_id="7")

    assert again.created is False
    assert again.job.id == child.job.id
    assert again.job.retry_of_job_id == root.job.id
    # The retry child is not a duplicate root: both exist, newest first.
    stored = await list_all(stub, resource_type="doc", resource_id="7")
    assert [job.id for job in stored] == [child.job.id, root.job.id]
    # Let the child finish rather than leave it running into teardown.
    assert (await wait_for_terminal(stub, child.job.id)).status == jobs_pb2.JOB_STATUS_FAILED

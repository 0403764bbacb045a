"""INVALID_ARGUMENT naming the field, for every kind of bad input (DESIGN §2 status codes).

Each rejected Enqueue must also leave nothing behind: the caller's List stays empty.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, timestamp_pb2
from google.protobuf.internal.encoder import _VarintBytes

from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    by_id_call,
    collect_events,
    drain,
    enqueue,
    error_reason,
    expect_error,
    expect_invalid,
    field_violations,
    list_jobs,
    struct,
    wait_for_terminal,
)
from tests.support import OTHER_OWNER, OWNER, owner_metadata

PAYLOAD_LIMIT = 256 * 1024

ENQUEUE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("empty kind", {"kind": ""}, "kind"),
    ("kind of 129 characters", {"kind": "a" * 129}, "kind"),
    ("uppercase kind", {"kind": "Example.Echo"}, "kind"),
    ("kind with a space", {"kind": "example echo"}, "kind"),
    ("kind with a slash", {"kind": "example/echo"}, "kind"),
    ("kind with non-ascii", {"kind": "exämple.echo"}, "kind"),
    ("unknown kind", {"kind": "example.unknown"}, "kind"),
    ("unknown kind of 128 legal characters", {"kind": "a" * 128}, "kind"),
    ("resource_type of 257", {"resource_type": "t" * 257, "resource_id": "1"}, "resource_type"),
    ("resource_id of 257", {"resource_type": "doc", "resource_id": "i" * 257}, "resource_id"),
    ("resource_id without resource_type", {"resource_id": "1"}, "resource_type"),
    ("negative max_attempts", {"max_attempts": -1}, "max_attempts"),
    ("most negative max_attempts", {"max_attempts": -(2**31)}, "max_attempts"),
    ("max_attempts 101", {"max_attempts": 101}, "max_attempts"),
    ("negative timeout_seconds", {"timeout_seconds": -1}, "timeout_seconds"),
    ("timeout_seconds 86401", {"timeout_seconds": 86_401}, "timeout_seconds"),
    ("payload over 256 KiB", {"payload": {"blob": "x" * PAYLOAD_LIMIT}}, "payload"),
    # PostgreSQL text cannot hold U+0000; every engine refuses it alike.
    ("resource_type with NUL", {"resource_type": "d\x00c", "resource_id": "1"}, "resource_type"),
    ("resource_id with NUL", {"resource_type": "doc", "resource_id": "1\x00"}, "resource_id"),
    ("priority 6", {"priority": 6}, "priority"),
    ("negative priority", {"priority": -1}, "priority"),
    # 2100-01-01: far more than a year ahead of any run of these tests.
    ("run_at decades ahead", {"run_at": timestamp_pb2.Timestamp(seconds=4_102_444_800)}, "run_at"),
    ("run_at past year 9999", {"run_at": timestamp_pb2.Timestamp(seconds=2**40)}, "run_at"),
    ("run_at with bad nanos", {"run_at": timestamp_pb2.Timestamp(seconds=1, nanos=-1)}, "run_at"),
    *(
        (f"retry_policy {name}", {"retry_policy": jobs_pb2.RetryPolicy(**policy)}, f"retry_policy.{field}")
        for name, policy, field in (
            ("negative interval", {"initial_interval_seconds": -1}, "initial_interval_seconds"),
            ("NaN interval", {"initial_interval_seconds": math.nan}, "initial_interval_seconds"),
            ("interval over a year", {"initial_interval_seconds": 4e7}, "initial_interval_seconds"),
            ("coefficient below 1", {"backoff_coefficient": 0.5}, "backoff_coefficient"),
            ("coefficient 101", {"backoff_coefficient": 101}, "backoff_coefficient"),
            ("negative max", {"max_interval_seconds": -5}, "max_interval_seconds"),
            (
                "max below initial",
                {"initial_interval_seconds": 10, "max_interval_seconds": 5},
                "max_interval_seconds",
            ),
            ("33 error types", {"non_retryable_error_types": ["E"] * 33}, "non_retryable_error_types"),
            ("empty error type", {"non_retryable_error_types": ["E", ""]}, "non_retryable_error_types[1]"),
            ("error type of 129", {"non_retryable_error_types": ["E" * 129]}, "non_retryable_error_types[0]"),
            ("error type with NUL", {"non_retryable_error_types": ["E\x00"]}, "non_retryable_error_types[0]"),
        )
    ),
]


def _enqueue_request(fields: dict[str, Any]) -> jobs_pb2.EnqueueRequest:
    fields = {"kind": "example.echo", **fields}
    payload = fields.pop("payload", None)
    return jobs_pb2.EnqueueRequest(payload=struct(payload), **fields)


async def _nothing_stored(stub) -> None:
    page = await list_jobs(stub)
    assert list(page.jobs) == [] and page.next_page_token == ""


@pytest.mark.parametrize(
    ("fields", "field"), [case[1:] for case in ENQUEUE_CASES], ids=[case[0] for case in ENQUEUE_CASES]
)
async def test_bad_enqueue_is_invalid_argument_naming_the_field_and_writes_nothing(stub, app, fields, field):
    err = await expect_invalid(stub.Enqueue(_enqueue_request(fields), metadata=owner_metadata()), field)
    assert err.details().startswith(f"{field}:"), err.details()
    assert error_reason(err) == "INVALID_ARGUMENT"
    await _nothing_stored(stub)


def _payload_of_exact_size(size: int) -> dict[str, str]:
    for length in range(size, size - 64, -1):
        payload = {"blob": "x" * length}
        if struct(payload).ByteSize() == size:
            return payload
    raise AssertionError("no payload of that size")


async def test_payload_of_exactly_256_kib_is_accepted_and_one_byte_more_is_not(stub, app):
    at_limit = _payload_of_exact_size(PAYLOAD_LIMIT)
    over = _payload_of_exact_size(PAYLOAD_LIMIT + 1)

    accepted = await enqueue(stub, "example.echo", at_limit)
    await expect_invalid(
        stub.Enqueue(_enqueue_request({"payload": over}), metadata=owner_metadata()), "payload"
    )

    assert accepted.created
    assert [job.id for job in (await list_jobs(stub)).jobs] == [accepted.job.id]


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "infinity"])
async def test_non_finite_number_in_payload_is_invalid_argument(stub, app, value):
    await expect_invalid(
        stub.Enqueue(_enqueue_request({"payload": {"x": value}}), metadata=owner_metadata()), "payload"
    )
    await _nothing_stored(stub)


# ----- undecodable requests ---------------------------------------------------------


def _length_delimited(field: int, body: bytes) -> bytes:
    return _VarintBytes((field << 3) | 2) + _VarintBytes(len(body)) + body


def _nested_payload_request(levels: int) -> bytes:
    """EnqueueRequest bytes whose payload nests `levels` ListValues inside each
    other: Struct{"a": Value{list_value: ListValue{values: [Value{list_value: ...}]}}}."""
    list_value = b""
    for _ in range(levels):
        list_value = _length_delimited(1, _length_delimited(6, list_value))
    entry = _length_delimited(1, b"a") + _length_delimited(2, _length_delimited(6, list_value))
    payload = _length_delimited(1, entry)
    return _length_delimited(1, b"example.echo") + _length_delimited(4, payload)


def _raw_enqueue(channel):
    return channel.unary_unary(
        "/leasehold.v1.JobService/Enqueue",
        request_serializer=lambda data: data,
        response_deserializer=jobs_pb2.EnqueueResponse.FromString,
    )


async def test_hand_built_request_bytes_are_understood(channel, stub, app):
    # The control for the next test: the same encoder, shallow enough to decode.
    response = await _raw_enqueue(channel)(_nested_payload_request(5), metadata=owner_metadata())
    assert response.created
    events = await collect_events(stub, response.job.id)
    echo = next(event for event in events if event.type == "echo")
    assert "a" in echo.payload.fields


async def test_payload_nested_past_the_recursion_limit_is_invalid_argument(channel, stub, app):
    err = await expect_error(
        _raw_enqueue(channel)(_nested_payload_request(200), metadata=owner_metadata()),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert len(field_violations(err)) == 1
    await _nothing_stored(stub)


async def test_truncated_request_bytes_are_invalid_argument(channel, stub, app):
    # Field 1 claims 100 bytes but the message ends after 3.
    await expect_error(
        _raw_enqueue(channel)(b"\x0a\x64abc", metadata=owner_metadata()),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    await _nothing_stored(stub)


def _nested_dict(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def _deepest_enqueueable_payload() -> dict[str, Any]:
    """The most deeply nested payload whose EnqueueRequest protobuf still decodes."""
    levels = 1
    while True:
        try:
            request = jobs_pb2.EnqueueRequest(kind="example.echo", payload=struct(_nested_dict(levels + 1)))
            jobs_pb2.EnqueueRequest.FromString(request.SerializeToString())
        except Exception:
            return _nested_dict(levels)
        levels += 1


async def test_an_accepted_payload_can_always_be_watched_back(stub, app):
    payload = _deepest_enqueueable_payload()
    try:
        response = await enqueue(stub, "example.echo", payload)
    except grpc.aio.AioRpcError as err:
        # Rejecting it up front is an acceptable fix.
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field_violations(err) == ["payload"]
        return
    events = await collect_events(stub, response.job.id)
    echo = [event for event in events if event.type == "echo"]
    assert len(echo) == 1 and echo[0].payload == struct(payload)


# ----- job ids and other RPCs ---------------------------------------------------------


def _by_id_calls(stub, job_id: str):
    metadata = owner_metadata()
    return {
        "Get": lambda: stub.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=metadata),
        "Cancel": lambda: stub.Cancel(jobs_pb2.CancelRequest(job_id=job_id), metadata=metadata),
        "Retry": lambda: stub.Retry(jobs_pb2.RetryRequest(job_id=job_id), metadata=metadata),
        "WatchEvents": lambda: drain(
            stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id), metadata=metadata)
        ),
    }


@pytest.mark.parametrize("rpc", ["Get", "Cancel", "Retry", "WatchEvents"])
@pytest.mark.parametrize("job_id", ["", "j" * 257], ids=["empty", "257 characters"])
async def test_missing_or_oversized_job_id_is_invalid_argument(stub, app, rpc, job_id):
    await expect_invalid(_by_id_calls(stub, job_id)[rpc](), "job_id")
    await _nothing_stored(stub)


async def test_negative_after_sequence_is_invalid_argument(stub, app):
    job = (await enqueue(stub)).job
    call = stub.WatchEvents(
        jobs_pb2.WatchEventsRequest(job_id=job.id, after_sequence=-1), metadata=owner_metadata()
    )
    await expect_invalid(drain(call), "after_sequence")


async def test_list_rejects_negative_page_size(stub, app):
    await expect_invalid(list_jobs(stub, page_size=-1), "page_size")


@pytest.mark.parametrize(
    "statuses",
    [
        [jobs_pb2.JOB_STATUS_UNSPECIFIED],
        [jobs_pb2.JOB_STATUS_QUEUED, jobs_pb2.JOB_STATUS_UNSPECIFIED],
        [99],
    ],
    ids=["unspecified", "unspecified among valid", "unknown enum value"],
)
async def test_list_rejects_unspecified_or_unknown_status(stub, app, statuses):
    await expect_invalid(list_jobs(stub, statuses=statuses), "statuses")


async def test_list_rejects_oversized_filter_fields(stub, app):
    await expect_invalid(list_jobs(stub, kind="k" * 129), "kind")
    await expect_invalid(list_jobs(stub, resource_type="t" * 257), "resource_type")
    await expect_invalid(list_jobs(stub, resource_id="i" * 257), "resource_id")


# ----- page tokens ----------------------------------------------------------------------


async def _real_token(stub, owner: str = OWNER, **filters: Any) -> str:
    for _ in range(3):
        await enqueue(stub, "test.gate", owner=owner)
    page = await list_jobs(stub, owner=owner, page_size=1, **filters)
    assert page.next_page_token
    return page.next_page_token


def _flip(text: str, index: int) -> str:
    char = text[index]
    replacement = "B" if char == "A" else "A"
    return text[:index] + replacement + text[index + 1 :]


@pytest.mark.parametrize(
    "token",
    ["garbage", ".", "a.b", "a.b.c", "!!!.???", "ü.ü", "x" * 5000],
)
async def test_garbage_page_token_is_invalid_argument(stub, app, token):
    await expect_invalid(list_jobs(stub, page_token=token), "page_token")


async def test_tampered_page_token_is_invalid_argument(stub, app):
    token = await _real_token(stub)
    body, signature = token.split(".")
    assert (await list_jobs(stub, page_size=1, page_token=token)).jobs  # the original works

    for tampered in (
        _flip(token, 0),  # first character of the body
        _flip(token, len(body) // 2),
        f"{body}.{_flip(signature, 0)}",  # first character of the signature
        f"{signature}.{body}",
        token[:-4],
        token + "A",
    ):
        await expect_invalid(list_jobs(stub, page_size=1, page_token=tampered), "page_token")


async def test_page_token_with_edited_last_character_is_rejected(stub, app):
    token = await _real_token(stub)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(token[-1])
    edited = token[:-1] + alphabet[last ^ 1]  # 43-char signature: the low 2 bits are padding
    assert edited != token
    await expect_invalid(list_jobs(stub, page_size=1, page_token=edited), "page_token")


async def test_page_token_reused_with_other_filters_is_invalid_argument(stub, app):
    token = await _real_token(stub, kind="test.gate")
    assert (await list_jobs(stub, page_size=1, page_token=token, kind="test.gate")).jobs

    for other in (
        {},
        {"kind": "example.echo"},
        {"kind": "test.gate", "statuses": [jobs_pb2.JOB_STATUS_QUEUED]},
        {"kind": "test.gate", "resource_type": "doc"},
    ):
        await expect_invalid(list_jobs(stub, page_size=1, page_token=token, **other), "page_token")


async def test_page_token_of_another_owner_is_invalid_argument(stub, app):
    token = await _real_token(stub, owner=OWNER)
    for _ in range(3):
        await enqueue(stub, "test.gate", owner=OTHER_OWNER)

    err = await expect_invalid(
        list_jobs(stub, owner=OTHER_OWNER, page_size=1, page_token=token), "page_token"
    )
    assert OWNER not in err.details()


async def test_page_size_change_between_pages_is_allowed(stub, app):
    token = await _real_token(stub)
    page = await list_jobs(stub, page_size=5, page_token=token)
    assert len(page.jobs) == 2 and page.next_page_token == ""


async def test_finished_job_is_still_valid_input_for_after_sequence_zero(stub, app):
    # A sanity anchor for the INVALID_ARGUMENT cases above: the same RPC with a
    # valid after_sequence succeeds.
    job = (await enqueue(stub)).job
    await wait_for_terminal(stub, job.id)
    assert len(await collect_events(stub, job.id, after=0)) >= 3


@pytest.mark.parametrize("rpc", ["Get", "Cancel", "Retry", "WatchEvents"])
async def test_a_job_id_with_nul_is_invalid_argument(stub, app, rpc):
    """No job id can hold U+0000: malformed whoever asks, so the answer says
    nothing about whose jobs exist."""
    job_id = (await enqueue(stub)).job.id
    call = by_id_call(stub, rpc, job_id + "\x00", OWNER)

    await expect_invalid(call, "job_id")


@pytest.mark.parametrize("field", ["kind", "resource_type", "resource_id"])
async def test_a_list_filter_with_nul_is_invalid_argument(stub, app, field):
    await expect_invalid(list_jobs(stub, **{field: "x\x00"}), field)


async def test_a_handler_error_with_nul_is_stored_with_a_replacement_character(stub, app):
    """A handler's exception text is whatever the handler made it; recording the
    failure must not fail on a character the database cannot store."""
    job = (await enqueue(stub, "example.fail", {"message": "bo\x00om"}, max_attempts=1)).job

    final = await wait_for_terminal(stub, job.id)

    assert final.status == jobs_pb2.JOB_STATUS_FAILED
    assert final.error_message == "bo\ufffdom"


async def test_a_payload_string_with_nul_is_stored_and_given_back(stub, app):
    """JSON can carry U+0000 inside a string, and so can a payload: it must come
    back as sent, through the job the handler was given and the event it appends."""
    payload = {"text": "a\x00b", "nested": {"list": ["\x00"]}}
    job = (await enqueue(stub, "example.echo", payload)).job

    final = await wait_for_terminal(stub, job.id)
    echoed = [event for event in await collect_events(stub, job.id) if event.type == "echo"]

    assert final.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert [json_format.MessageToDict(event.payload) for event in echoed] == [payload]

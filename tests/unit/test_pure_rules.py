"""Pure functions and values: no server, no database."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from structlog.testing import capture_logs

from leasehold._server.api.errors import status_for
from leasehold._server.api.owner import OwnerUnresolved
from leasehold._server.api.page_token import PageTokenCodec
from leasehold._server.config import Settings
from leasehold._server.jobs import limits, state_machine
from leasehold._server.jobs.errors import (
    InvalidArgument,
    JobNotFound,
    RetryNotAllowed,
    StorageFull,
    StorageUnavailable,
)
from leasehold._server.jobs.records import JobFilter, JobStatus, PageCursor
from leasehold._server.jobs.sql import sqlite_safety
from leasehold.worker import LeaseLost


@pytest.mark.parametrize(
    ("attempt", "seconds"), [(1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (6, 30), (50, 30)]
)
def test_backoff_doubles_per_attempt_up_to_30_seconds(attempt: int, seconds: int) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    job = {"attempt": attempt, **state_machine.policy_columns(None)}

    assert state_machine.next_retry_at(now, job, jitter=0.9) == now + timedelta(seconds=seconds)


def test_error_text_is_the_message_cut_to_1000_characters() -> None:
    assert limits.error_text(RuntimeError("boom")) == "boom"
    assert limits.error_text(RuntimeError("y" * 1001)) == "y" * 1000
    assert limits.error_text(KeyError()) == "KeyError"


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (OwnerUnresolved("missing x-owner-id header"), grpc.StatusCode.UNAUTHENTICATED, "OWNER_UNRESOLVED"),
        (InvalidArgument("kind", "bad"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (JobNotFound("job_x"), grpc.StatusCode.PERMISSION_DENIED, "JOB_NOT_ACCESSIBLE"),
        (RetryNotAllowed("job_x", "queued"), grpc.StatusCode.FAILED_PRECONDITION, "JOB_NOT_RETRYABLE"),
        (LeaseLost("job_x"), grpc.StatusCode.ABORTED, "LEASE_LOST"),
        (StorageUnavailable("database is read-only"), grpc.StatusCode.UNAVAILABLE, "STORAGE_UNAVAILABLE"),
        (StorageFull("database or disk is full"), grpc.StatusCode.RESOURCE_EXHAUSTED, "STORAGE_FULL"),
        (ZeroDivisionError("bug"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    ],
)
def test_each_domain_error_maps_to_one_status_with_error_info(
    error: Exception, code: grpc.StatusCode, reason: str
) -> None:
    status = status_for(error)

    assert status.code == code
    details = dict(status.trailing_metadata)["grpc-status-details-bin"]
    decoded = status_pb2.Status.FromString(details)
    info = error_details_pb2.ErrorInfo()
    assert decoded.details[0].Unpack(info)
    assert (info.reason, info.domain) == (reason, "leasehold")
    if code == grpc.StatusCode.INTERNAL:
        assert status.details == "internal error"  # no internals leak


def test_invalid_argument_names_the_field_in_a_bad_request() -> None:
    status = status_for(InvalidArgument("payload", "too large"))

    decoded = status_pb2.Status.FromString(dict(status.trailing_metadata)["grpc-status-details-bin"])
    bad_request = error_details_pb2.BadRequest()
    assert decoded.details[1].Unpack(bad_request)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [("payload", "too large")]


def test_denials_for_a_missing_and_a_foreign_job_are_byte_identical() -> None:
    first, second = status_for(JobNotFound("job_a")), status_for(JobNotFound("job_a"))

    assert (first.code, first.details, first.trailing_metadata) == (
        second.code,
        second.details,
        second.trailing_metadata,
    )


class TestPageTokens:
    codec = PageTokenCodec(b"k" * 32)
    running = JobFilter(statuses=frozenset({JobStatus.RUNNING}))

    def test_round_trip(self) -> None:
        token = self.codec.encode("alice", self.running, PageCursor("job_41"))

        assert self.codec.decode("alice", self.running, token) == PageCursor("job_41")

    @pytest.mark.parametrize("token", ["", "abc", "a.b.c", "!!!.???", "e30.AAAA"])
    def test_garbage_is_rejected(self, token: str) -> None:
        with pytest.raises(InvalidArgument) as rejected:
            self.codec.decode("alice", self.running, token)
        assert rejected.value.field == "page_token"

    def test_every_single_character_edit_is_rejected(self) -> None:
        token = self.codec.encode("alice", self.running, PageCursor("job_41"))
        for index in range(len(token)):
            replacement = "A" if token[index] != "A" else "B"
            tampered = token[:index] + replacement + token[index + 1 :]
            with pytest.raises(InvalidArgument):
                self.codec.decode("alice", self.running, tampered)

    def test_another_owner_or_filter_or_key_is_rejected(self) -> None:
        token = self.codec.encode("alice", self.running, PageCursor("job_41"))

        with pytest.raises(InvalidArgument):
            self.codec.decode("bob", self.running, token)
        with pytest.raises(InvalidArgument, match="different filters"):
            self.codec.decode("alice", JobFilter(), token)
        with pytest.raises(InvalidArgument):
            PageTokenCodec(b"z" * 32).decode("alice", self.running, token)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"database_url": ""}, "database_url"),
        ({"listen": "nonsense"}, "listen"),
        ({"listen": "host:99999"}, "listen"),
        ({"handler_modules": ()}, "handlers"),
        ({"page_token_key": b"short"}, "page_token_key"),
        ({"log_level": "loud"}, "log_level"),
    ],
)
def test_settings_name_the_bad_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Settings(**overrides)  # type: ignore[arg-type]


def test_an_affected_sqlite_is_warned_about_with_the_remedy_and_a_fixed_one_is_not() -> None:
    with capture_logs() as logs:
        sqlite_safety.warn_if_exposed(sqlite_safety.Sharing.SHARED, version=(3, 40, 1))
        sqlite_safety.warn_if_exposed(sqlite_safety.Sharing.SHARED, version=(3, 51, 3))
        sqlite_safety.warn_if_exposed(sqlite_safety.Sharing.SOLE_WRITER, version=(3, 40, 1))

    (warned,) = [r for r in logs if r["event"] == "storage.sqlite_wal_reset_bug"]
    assert (warned["log_level"], warned["sqlite_version"], warned["fixed_in"]) == (
        "warning",
        "3.40.1",
        "3.51.3",
    )
    assert "LD_LIBRARY_PATH" in warned["message"] and "PostgreSQL" in warned["message"]


def test_the_linked_sqlite_is_checked_by_default() -> None:
    with capture_logs() as logs:
        sqlite_safety.warn_if_exposed()

    warned = [r for r in logs if r["event"] == "storage.sqlite_wal_reset_bug"]
    if sqlite_safety.is_affected(sqlite3.sqlite_version_info):
        assert [r["sqlite_version"] for r in warned] == [sqlite3.sqlite_version]
    else:
        assert warned == []


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([1, 2], "JSON object"),
        ({"n": float("inf")}, "finite"),
        ({"n": 10**400}, "double"),
        ({"x": "y" * limits.PAYLOAD_BYTES_LIMIT}, "bytes"),
        ({"set": {1, 2}}, "plain JSON"),
        ({1: "x"}, "keys must be strings"),
        ({"inner": {None: 1}}, "keys must be strings"),
        ({"x": "é" * (limits.PAYLOAD_BYTES_LIMIT // 2)}, "bytes"),
    ],
)
def test_payload_rules_refuse_what_a_struct_cannot_carry(payload: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as refused:
        limits.check_payload(payload)
    assert refused.value.field == "payload"


def test_a_cyclic_payload_is_refused_as_too_deep() -> None:
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    with pytest.raises(InvalidArgument, match="nested at most"):
        limits.check_payload(cyclic)


def test_payload_size_counts_serialized_bytes_not_escaped_json() -> None:
    # 200 KB of UTF-8 that ASCII-escaped JSON would count as 600 KB.
    limits.check_payload({"x": "é" * 100_000})


def test_payload_depth_is_limited_to_32_levels() -> None:
    def nested(levels: int) -> dict[str, object]:
        value: dict[str, object] = {}
        for _ in range(levels - 1):
            value = {"a": value}
        return value

    limits.check_payload(nested(32))
    with pytest.raises(InvalidArgument, match="deep"):
        limits.check_payload(nested(33))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"lease_seconds": float("nan")}, "lease_seconds"),
        ({"lease_seconds": 1e300}, "lease_seconds"),
        ({"poll_seconds": float("nan")}, "poll_seconds"),
        ({"poll_seconds": 1e9}, "poll_seconds"),
    ],
)
def test_runtime_settings_refuse_non_finite_and_absurd_durations(
    overrides: dict[str, float], field: str
) -> None:
    from leasehold._server.runtime.claim_loop import RuntimeSettings

    with pytest.raises(ValueError, match=field):
        RuntimeSettings(**overrides)  # type: ignore[arg-type]

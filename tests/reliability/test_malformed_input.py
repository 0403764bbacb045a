"""Experiment 10 — malformed input never breaks the service (DESIGN §2 status codes,
docs/api.md "Errors").

The promise: whatever a caller sends — random field values, random bytes as the
request body, messages past grpc's 4 MiB cap, payloads nested 10^5 levels deep, owner
headers that are missing, repeated, 8 KB long or not even UTF-8 — the answer is the
documented status (INVALID_ARGUMENT naming the field, UNAUTHENTICATED for the owner,
PERMISSION_DENIED for ids the caller cannot see, FAILED_PRECONDITION for a Retry that is
not allowed), never INTERNAL or UNKNOWN; a rejected request writes nothing; and the
server is healthy afterwards.

How: hypothesis generates the inputs and an oracle written from the documented rules
(not from the server's code) predicts each answer. For bytes it decodes the request with
the same protobuf library first, so "cannot be decoded" is predicted exactly. Every
request is checked against its prediction, against the rich status (ErrorInfo,
BadRequest) and against a digest of the `jobs` and `job_events` tables read straight
from the database before and after: only an Enqueue that created a job may change
them. Each test ends by checking the health service, a normal Enqueue + Get, and the
server's log for `api.internal_error`.

What grpc answers before any Leasehold code runs is kept apart and stated as such: a
message over 4 MiB gets grpc's RESOURCE_EXHAUSTED (pinned), and a header name HTTP/2
forbids or a `-bin` value that is not base64 gets grpc's transport error (recorded).

The server is one `leasehold serve` subprocess per module rather than the `app`
fixture: hypothesis drives a synchronous test many hundred times, and the `app` fixture
is function-scoped and bound to pytest-asyncio's per-test loop. A subprocess is also the
shape that is deployed, keeps its JSON log to scan, and turns a crash in the decoder
(say, on a 10^5-level message) into a dead process the test sees instead of a dead test
runner. Owner headers that grpc's own client refuses to send (non-ASCII, control
characters) are sent by a minimal HTTP/2 client written here.

Every experiment runs on both storage engines: the module's server runs once on a
SQLite file and once on a PostgreSQL database, and each gets requests from the same
generators. Random strings are where the engines differ (PostgreSQL text cannot hold
U+0000, for one), so the PostgreSQL run is the one most likely to find an INTERNAL.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import math
import re
import socket
import struct
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import hypothesis.strategies as st
import pytest
import sqlalchemy as sa
from google.protobuf import json_format, struct_pb2, text_format
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, example, given, settings

from leasehold._server.jobs.sql.engines import flavour_of, parse_database_url
from leasehold.v1 import jobs_pb2
from tests.database_reads import sync_url
from tests.reliability.conftest import Figures
from tests.support import ENGINES, OWNER, require, sqlite_url
from tests.system.helpers import Leasehold

if TYPE_CHECKING:
    from tests.conftest import Postgres

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

SERVICE = "leasehold.v1.JobService"
RPCS = ("Enqueue", "Get", "List", "Cancel", "Retry", "WatchEvents", "BatchEnqueue")
REQUEST_TYPES: dict[str, type[Message]] = {
    "Enqueue": jobs_pb2.EnqueueRequest,
    "Get": jobs_pb2.GetRequest,
    "List": jobs_pb2.ListRequest,
    "Cancel": jobs_pb2.CancelRequest,
    "Retry": jobs_pb2.RetryRequest,
    "WatchEvents": jobs_pb2.WatchEventsRequest,
    "BatchEnqueue": jobs_pb2.BatchEnqueueRequest,
}
OWNER_HEADER = "x-owner-id"
OWNER_METADATA: tuple[tuple[str, str], ...] = ((OWNER_HEADER, OWNER),)
# The page-token key is set, so a test can sign tokens exactly as the server does.
PAGE_TOKEN_KEY = "malformed-input-experiment-key-0123456789"
CALL_TIMEOUT = 30.0

# ----- the documented rules (docs/api.md "Errors" limits, DESIGN §2) -----------------------
ECHO = "example.echo"  # the one registered kind the generators produce: it finishes at once
KIND_PATTERN = re.compile(r"[a-z0-9._-]{1,128}")
REGISTERED_KINDS = frozenset({"example.echo", "example.sleep", "example.fail"})
OWNER_PATTERN = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
OWNER_PATTERN_BYTES = re.compile(rb"[A-Za-z0-9._:@-]{1,128}")
RESOURCE_LIMIT = 256
JOB_ID_LIMIT = 256
LIST_KIND_LIMIT = 128
PAYLOAD_BYTES_LIMIT = 256 * 1024
PAYLOAD_DEPTH_LIMIT = 32
MAX_ATTEMPTS_LIMIT = 100
TIMEOUT_SECONDS_LIMIT = 86_400
BATCH_LIMIT = 1000
REQUEST_ID_LIMIT = 128  # AIP-155: 1-128 printable ASCII characters, or empty for none
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 50, 500
GRPC_MESSAGE_CAP = 4 * 1024 * 1024
VALID_STATUSES = frozenset(range(1, 6))
UNKNOWN_ID = "job_" + "0" * 32
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled"})
NEVER = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})

Code = grpc.StatusCode


# ----- what the oracle predicts ---------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    code: grpc.StatusCode
    fields: frozenset[str] = frozenset()  # INVALID_ARGUMENT: any one of these may be named
    job_id: str = ""  # PERMISSION_DENIED: the id the message must name
    why: str = ""


def _ok(why: str = "") -> Expected:
    return Expected(Code.OK, why=why)


def _invalid(*fields: str) -> Expected:
    return Expected(Code.INVALID_ARGUMENT, frozenset(fields), why=f"bad {', '.join(sorted(fields))}")


def _struct_faults(payload: struct_pb2.Struct) -> tuple[int, bool]:
    """(JSON nesting depth counting the top object as 1, whether every number is finite)."""
    deepest, finite = 0, True
    stack: list[tuple[Message, int]] = [(payload, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, struct_pb2.Struct):
            deepest = max(deepest, depth)
            stack.extend((value, depth) for value in item.fields.values())
        elif isinstance(item, struct_pb2.ListValue):
            deepest = max(deepest, depth)
            stack.extend((value, depth) for value in item.values)
        elif isinstance(item, struct_pb2.Value):
            which = item.WhichOneof("kind")
            if which == "number_value" and not math.isfinite(item.number_value):
                finite = False
            elif which == "struct_value":
                stack.append((item.struct_value, depth + 1))
            elif which == "list_value":
                stack.append((item.list_value, depth + 1))
    return deepest, finite


def _empty_value_paths(payload: struct_pb2.Struct) -> set[str]:
    """Where the payload holds a `Value` with no kind set, named as the server
    names them (`payload.a[0]`, `payload["odd key"]`): any one may be reported."""
    paths: set[str] = set()
    stack: list[tuple[Message, str]] = [(payload, "payload")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, struct_pb2.Struct):
            for key, value in item.fields.items():
                stack.append((value, f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"))
        elif isinstance(item, struct_pb2.ListValue):
            stack.extend((value, f"{path}[{index}]") for index, value in enumerate(item.values))
        elif isinstance(item, struct_pb2.Value):
            which = item.WhichOneof("kind")
            if which is None:
                paths.add(path)
            elif which == "struct_value":
                stack.append((item.struct_value, path))
            elif which == "list_value":
                stack.append((item.list_value, path))
    return paths


def _limit_fault(value: int, maximum: int) -> bool:
    return value != 0 and not 1 <= value <= maximum


def _text_fault(value: str, maximum: int) -> bool:
    """Too long, or holding U+0000 (which no engine stores in a text column)."""
    return len(value) > maximum or "\x00" in value


def _request_id_fault(request_id: str) -> bool:
    return bool(request_id) and (
        len(request_id) > REQUEST_ID_LIMIT or not all(" " <= char <= "~" for char in request_id)
    )


def expect_enqueue(request: jobs_pb2.EnqueueRequest) -> Expected:
    """The request id is read first (it keys the call): a malformed one is named alone."""
    if _request_id_fault(request.request_id):
        return _invalid("request_id")
    return _expect_new_job(request)


def _expect_new_job(request: jobs_pb2.EnqueueRequest) -> Expected:
    bad = set()
    if not KIND_PATTERN.fullmatch(request.kind) or request.kind not in REGISTERED_KINDS:
        bad.add("kind")
    if _text_fault(request.resource_type, RESOURCE_LIMIT):
        bad.add("resource_type")
    if _text_fault(request.resource_id, RESOURCE_LIMIT):
        bad.add("resource_id")
    if request.resource_id and not request.resource_type:
        bad.add("resource_type")
    if request.resource_type.startswith("leasehold."):  # reserved: schedules name their firings so
        bad.add("resource_type")
    depth, finite = _struct_faults(request.payload)
    # "payload <= 256 KiB serialized": the protobuf the caller sent, the only
    # serialization the API knows.
    if request.payload.ByteSize() > PAYLOAD_BYTES_LIMIT or not finite or depth > PAYLOAD_DEPTH_LIMIT:
        bad.add("payload")
    # Worker protocol 2: a Value with no kind set is refused, named by its path.
    empty = _empty_value_paths(request.payload)
    if empty:
        bad |= empty | {"payload"}
    if _limit_fault(request.max_attempts, MAX_ATTEMPTS_LIMIT):
        bad.add("max_attempts")
    if _limit_fault(request.timeout_seconds, TIMEOUT_SECONDS_LIMIT):
        bad.add("timeout_seconds")
    size = request.payload.ByteSize()
    return _invalid(*bad) if bad else _ok(f"valid; payload {size} bytes serialized, {depth} deep")


def expect_batch_enqueue(request: jobs_pb2.BatchEnqueueRequest) -> Expected:
    """The batch's request id first; then 1-1,000 items, or `requests`; else the first
    bad item, named by its place (an item's own request id must be empty: the batch is
    one call with one key)."""
    if _request_id_fault(request.request_id):
        return _invalid("request_id")
    if not 1 <= len(request.requests) <= BATCH_LIMIT:
        return _invalid("requests")
    for index, item in enumerate(request.requests):
        if item.request_id:
            return _invalid(f"requests[{index}].request_id")
        expected = _expect_new_job(item)
        if expected.code != Code.OK:
            return _invalid(*(f"requests[{index}].{name}" for name in expected.fields))
    return _ok(f"valid batch of {len(request.requests)}")


def _job_id_fault(job_id: str) -> bool:
    return not job_id or _text_fault(job_id, JOB_ID_LIMIT)


# ----- the service under test -----------------------------------------------------------


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    trailing: tuple[tuple[str, str | bytes], ...]
    responses: list[bytes]

    def rich_status(self) -> status_pb2.Status:
        raw = [value for key, value in self.trailing if key == "grpc-status-details-bin"]
        assert len(raw) == 1 and isinstance(raw[0], bytes), f"no grpc-status-details-bin: {self.trailing}"
        return status_pb2.Status.FromString(raw[0])


def _detail(status: status_pb2.Status, message_type: type[Message]) -> list[Any]:
    found = []
    for detail in status.details:
        if detail.Is(message_type.DESCRIPTOR):
            value = message_type()
            detail.Unpack(value)
            found.append(value)
    return found


class Probe:
    """A generated request with a short repr, so a failing example stays readable
    when it carries a 256 KiB string."""

    def __init__(self, request: Message | bytes, label: str = "") -> None:
        self.request = request
        self.label = label

    def __repr__(self) -> str:
        if self.label:
            shown, size = self.label, len(self.request) if isinstance(self.request, bytes) else 0
        elif isinstance(self.request, bytes):
            shown, size = repr(self.request), len(self.request)
        else:
            shown = text_format.MessageToString(self.request, as_one_line=True)
            size = self.request.ByteSize()
            shown = f"{type(self.request).__name__}({shown})"
        return shown if len(shown) <= 400 else f"{shown[:400]}... ({size} bytes serialized)"


@dataclass(repr=False)
class Service:
    """One `leasehold serve` process, a channel to it, and read-only eyes on its database."""

    process: Leasehold
    database_url: str
    channel: grpc.Channel = field(init=False)
    db: sa.Engine = field(init=False)
    tally: Counter[tuple[str, str]] = field(default_factory=Counter)
    own_jobs: dict[str, list[jobs_pb2.JobEvent]] = field(default_factory=dict)  # terminal, with their logs
    resources: dict[tuple[str, str], str] = field(default_factory=dict)  # (type, id) -> newest job
    tokens: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # issued page token -> filter
    tally_baseline: Counter[tuple[str, str]] = field(default_factory=Counter)
    internal_baseline: int = 0

    def __post_init__(self) -> None:
        assert self.process.port is not None
        self.port = self.process.port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        # A pooled engine: each read takes a connection and gives it back (rolled
        # back, so no snapshot outlives the read), without a new PostgreSQL session
        # per read -- there are two digests per request. SQLite opens read-only.
        self.db = sa.create_engine(sync_url(self.database_url), pool_size=1, max_overflow=0)

    def __repr__(self) -> str:
        return f"Service(port={self.port}, jobs={len(self.own_jobs)})"

    def close(self) -> None:
        self.channel.close()
        self.db.dispose()

    # ----- calls -----------------------------------------------------------------------

    def call(
        self, rpc: str, body: bytes, metadata: Sequence[tuple[str, str | bytes]] = OWNER_METADATA
    ) -> Outcome:
        """One call with `body` as the exact request bytes; the answer, OK or not."""
        path = f"/{SERVICE}/{rpc}"
        try:
            if rpc == "WatchEvents":
                stream = self.channel.unary_stream(path)(body, metadata=metadata, timeout=CALL_TIMEOUT)
                responses = list(stream)
                outcome = Outcome(stream.code(), stream.details() or "", (), responses)
            else:
                response, call = self.channel.unary_unary(path).with_call(
                    body, metadata=metadata, timeout=CALL_TIMEOUT
                )
                outcome = Outcome(call.code(), call.details() or "", (), [response])
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            outcome = Outcome(err.code(), err.details() or "", tuple(err.trailing_metadata() or ()), [])
        self.tally[(rpc, outcome.code.name)] += 1
        return outcome

    def _read(self, statement: str, **parameters: Any) -> list[tuple[Any, ...]]:
        with self.db.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.text(statement), parameters)]

    def digest(self) -> tuple[int, int, str]:
        """(jobs, job_events, a hash of every column of every job but its payload, in
        insertion order, and of every event's key, type and time). Payloads are left
        out (they are immutable, and up to 256 KiB each); an event is never updated, so
        its key and type stand for it. Timestamps are integer microseconds on both
        engines, so the same rows hash alike wherever they are stored."""
        jobs = self._read(
            "SELECT seq, id, owner_id, kind, resource_type, resource_id, status, attempt,"
            " max_attempts, timeout_seconds, available_at, cancel_requested_at, retry_of_job_id,"
            " error_message, lease_owner, lease_token, lease_expires_at, last_event_sequence,"
            " created_at, updated_at, started_at, completed_at FROM jobs ORDER BY seq"
        )
        events = self._read(
            "SELECT job_id, sequence, type, created_at FROM job_events ORDER BY job_id, sequence"
        )
        content = hashlib.sha256(repr((jobs, events)).encode()).hexdigest()
        return len(jobs), len(events), content

    def owner_of(self, job_id: str) -> str:
        found = self._read("SELECT owner_id FROM jobs WHERE id = :id", id=job_id)
        assert len(found) == 1, (job_id, found)
        return str(found[0][0])

    def watch_to_end(self, job_id: str, owner: str = OWNER) -> list[jobs_pb2.JobEvent]:
        outcome = self.call(
            "WatchEvents",
            jobs_pb2.WatchEventsRequest(job_id=job_id).SerializeToString(),
            ((OWNER_HEADER, owner),),
        )
        assert outcome.code == Code.OK, (outcome.code, outcome.details)
        events = [jobs_pb2.WatchEventsResponse.FromString(raw).event for raw in outcome.responses]
        assert events and events[-1].type in TERMINAL_EVENTS, [event.type for event in events]
        assert [event.sequence for event in events] == list(range(1, len(events) + 1))
        return events

    def ensure_own_jobs(self, count: int) -> list[str]:
        while len(self.own_jobs) < count:
            request = jobs_pb2.EnqueueRequest(kind=ECHO)
            self.check("Enqueue", request)
        return sorted(self.own_jobs)

    def issue_tokens(self) -> None:
        """Real page tokens for a few filters (page size 1, so each has a next page)."""
        self.ensure_own_jobs(3)
        for filters in ({}, {"kind": ECHO}, {"statuses": [jobs_pb2.JOB_STATUS_SUCCEEDED]}):
            request = jobs_pb2.ListRequest(page_size=1, **filters)  # type: ignore[arg-type]
            outcome = self.call("List", request.SerializeToString())
            assert outcome.code == Code.OK, outcome.details
            token = jobs_pb2.ListResponse.FromString(outcome.responses[0]).next_page_token
            assert token
            self.tokens[token] = _filter_key(request)

    # ----- the check every generated request goes through ---------------------------------

    def check(
        self,
        rpc: str,
        probe: Probe | Message | bytes,
        metadata: Sequence[tuple[str, str | bytes]] = OWNER_METADATA,
        expected: Expected | None = None,
    ) -> Outcome:
        request = probe.request if isinstance(probe, Probe) else probe
        body = request if isinstance(request, bytes) else request.SerializeToString()
        if expected is None:
            expected = self.expect(rpc, body)
        before = self.digest()
        outcome = self.call(rpc, body, metadata)
        context = f"{rpc} {Probe(request)!r} expected {expected}"
        assert outcome.code not in NEVER, f"{context}: got {outcome.code} {outcome.details!r}"
        assert outcome.code == expected.code, f"{context}: got {outcome.code} {outcome.details!r}"
        if outcome.code == Code.OK:
            created = self._check_ok(rpc, body, outcome, _caller(metadata))
        else:
            created = 0
            self._check_error(outcome, expected, context)
        after = self.digest()
        if not created:
            assert after == before, f"{context}: the database changed ({before} -> {after})"
        else:
            # The control that the digest sees writes on this engine: per job created,
            # one job and its four events (queued, started, echo, succeeded) more.
            assert after[:2] == (before[0] + created, before[1] + 4 * created), (
                f"{context}: {before} -> {after}"
            )
        return outcome

    def _check_error(self, outcome: Outcome, expected: Expected, context: str) -> None:
        status = outcome.rich_status()
        assert status.code == outcome.code.value[0] and status.message == outcome.details, context
        (info,) = _detail(status, error_details_pb2.ErrorInfo)
        assert info.domain == "leasehold", context
        if outcome.code == Code.INVALID_ARGUMENT:
            (bad_request,) = _detail(status, error_details_pb2.BadRequest)
            named = [violation.field for violation in bad_request.field_violations]
            assert len(named) == 1 and named[0] in expected.fields, f"{context}: named {named}"
            assert outcome.details.startswith(f"{named[0]}: "), f"{context}: {outcome.details!r}"
            assert info.reason == "INVALID_ARGUMENT"
        elif outcome.code == Code.PERMISSION_DENIED:
            assert outcome.details == f"job {expected.job_id} not found or not accessible", context
            assert info.reason == "JOB_NOT_ACCESSIBLE"
        elif outcome.code == Code.UNAUTHENTICATED:
            assert info.reason == "OWNER_UNRESOLVED"
        elif outcome.code == Code.FAILED_PRECONDITION:
            assert info.reason == "JOB_NOT_RETRYABLE"

    def _check_ok(self, rpc: str, body: bytes, outcome: Outcome, caller: str) -> int:
        """Check an OK answer against the request; returns how many jobs it created."""
        if rpc == "Enqueue":
            response = jobs_pb2.EnqueueResponse.FromString(outcome.responses[0])
            return int(self._check_enqueued(jobs_pb2.EnqueueRequest.FromString(body), response))
        if rpc == "BatchEnqueue":
            batch = jobs_pb2.BatchEnqueueRequest.FromString(body)
            answers = jobs_pb2.BatchEnqueueResponse.FromString(outcome.responses[0]).responses
            assert len(answers) == len(batch.requests), (len(answers), len(batch.requests))
            # In request order: an item naming a resource an earlier item created
            # finds it in `resources` and must have been answered created = false.
            return sum(
                self._check_enqueued(request, answer)
                for request, answer in zip(batch.requests, answers, strict=True)
            )
        if rpc == "List":
            request = jobs_pb2.ListRequest.FromString(body)
            response = jobs_pb2.ListResponse.FromString(outcome.responses[0])
            size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
            assert len(response.jobs) <= size
            for job in response.jobs:
                assert self.owner_of(job.id) == caller, f"List showed another owner's job {job.id}"
                assert not request.statuses or job.status in request.statuses
                for name in ("kind", "resource_type", "resource_id"):
                    wanted = getattr(request, name)
                    assert not wanted or getattr(job, name) == wanted, (name, wanted, job)
            if response.next_page_token and caller == OWNER:
                self.tokens[response.next_page_token] = _filter_key(request)
            return 0
        if rpc == "WatchEvents":
            request = jobs_pb2.WatchEventsRequest.FromString(body)
            log = self.own_jobs[request.job_id]
            events = [jobs_pb2.WatchEventsResponse.FromString(raw).event for raw in outcome.responses]
            assert events == [event for event in log if event.sequence > request.after_sequence]
            return 0
        job = jobs_pb2.GetResponse.FromString(outcome.responses[0]).job  # Get and Cancel: same shape
        assert job.id in self.own_jobs and job.status == jobs_pb2.JOB_STATUS_SUCCEEDED, job
        return 0

    def _check_enqueued(self, request: jobs_pb2.EnqueueRequest, response: jobs_pb2.EnqueueResponse) -> bool:
        job = response.job
        key = (request.resource_type, request.resource_id)
        if request.resource_id and key in self.resources:
            assert not response.created and job.id == self.resources[key], (key, job.id)
            return False
        assert response.created and job.id not in self.own_jobs
        assert job.status == jobs_pb2.JOB_STATUS_QUEUED
        assert (job.kind, job.resource_type, job.resource_id) == (
            request.kind,
            request.resource_type,
            request.resource_id,
        )
        assert job.max_attempts == (request.max_attempts or 3)
        assert job.timeout_seconds == (request.timeout_seconds or 900)
        # Let it finish, so the next request starts from a quiet database, and check
        # the payload survived the trip through the database and back byte for byte.
        events = self.watch_to_end(job.id)
        assert [event.type for event in events] == ["job.queued", "job.started", "echo", "job.succeeded"]
        assert json_format.MessageToDict(events[2].payload) == json_format.MessageToDict(request.payload)
        self.own_jobs[job.id] = events
        if request.resource_id:
            self.resources[key] = job.id
        return True

    # ----- the oracle ----------------------------------------------------------------------

    def expect(self, rpc: str, body: bytes) -> Expected:
        try:
            request = REQUEST_TYPES[rpc].FromString(body)
        except (DecodeError, RecursionError):
            return _invalid("request")
        if isinstance(request, jobs_pb2.EnqueueRequest):
            return expect_enqueue(request)
        if isinstance(request, jobs_pb2.BatchEnqueueRequest):
            return expect_batch_enqueue(request)
        if isinstance(request, jobs_pb2.ListRequest):
            return self._expect_list(request)
        if isinstance(request, jobs_pb2.WatchEventsRequest):
            bad = {"job_id"} if _job_id_fault(request.job_id) else set()
            if request.after_sequence < 0:
                bad.add("after_sequence")
            if bad:
                return _invalid(*bad)
            return self._expect_existing(request.job_id, _ok("own job: its events after after_sequence"))
        assert isinstance(request, jobs_pb2.GetRequest | jobs_pb2.CancelRequest | jobs_pb2.RetryRequest)
        if _job_id_fault(request.job_id):
            return _invalid("job_id")
        if rpc == "Retry":
            own = Expected(Code.FAILED_PRECONDITION, why="own succeeded job: not retryable")
        else:
            own = _ok("own terminal job, unchanged")
        return self._expect_existing(request.job_id, own)

    def _expect_existing(self, job_id: str, own: Expected) -> Expected:
        if job_id in self.own_jobs:
            return own
        return Expected(Code.PERMISSION_DENIED, job_id=job_id, why="not the caller's job")

    def _expect_list(self, request: jobs_pb2.ListRequest) -> Expected:
        bad = set()
        if request.page_size < 0:
            bad.add("page_size")
        if any(status not in VALID_STATUSES for status in request.statuses):
            bad.add("statuses")
        if _text_fault(request.kind, LIST_KIND_LIMIT):
            bad.add("kind")
        if _text_fault(request.resource_type, RESOURCE_LIMIT):
            bad.add("resource_type")
        if _text_fault(request.resource_id, RESOURCE_LIMIT):
            bad.add("resource_id")
        if request.page_token and self.tokens.get(request.page_token) != _filter_key(request):
            bad.add("page_token")
        return _invalid(*bad) if bad else _ok("a valid List")

    # ----- health ----------------------------------------------------------------------------

    def assert_healthy(self) -> None:
        """Serving, and nothing since the test began was logged as an internal error."""
        self.assert_serving()
        internal = self.process.events("api.internal_error")[self.internal_baseline :]
        assert not internal, f"the server answered INTERNAL: {internal[:3]}"

    def assert_serving(self) -> None:
        """Alive, SERVING, and a normal Enqueue + Get works."""
        assert self.process.returncode is None, f"server exited:\n{self.process.output[-3000:]}"
        health = health_pb2_grpc.HealthStub(self.channel)
        for name in ("", SERVICE):
            response = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        before = len(self.own_jobs)
        outcome = self.check("Enqueue", jobs_pb2.EnqueueRequest(kind=ECHO, payload=_struct({"ok": True})))
        job_id = jobs_pb2.EnqueueResponse.FromString(outcome.responses[0]).job.id
        assert len(self.own_jobs) == before + 1
        self.check("Get", jobs_pb2.GetRequest(job_id=job_id))

    def begin(self) -> None:
        """A test starts: count its requests and internal errors from here."""
        self.tally_baseline = self.tally.copy()
        self.internal_baseline = len(self.process.events("api.internal_error"))

    def report(self, figures: Figures, rpcs: Sequence[str]) -> None:
        sent = self.tally - self.tally_baseline
        figures("requests sent", sum(sent.values()))
        for rpc in rpcs:
            by_code = {code: n for (name, code), n in sorted(sent.items()) if name == rpc}
            if by_code:
                figures(f"{rpc} by status", ", ".join(f"{code} {n}" for code, n in by_code.items()))


def _caller(metadata: Sequence[tuple[str, str | bytes]]) -> str:
    (value,) = [value for key, value in metadata if key == OWNER_HEADER]
    return value.decode() if isinstance(value, bytes) else value


def _filter_key(request: jobs_pb2.ListRequest) -> tuple[Any, ...]:
    return (frozenset(request.statuses), request.kind, request.resource_type, request.resource_id)


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    result = struct_pb2.Struct()
    result.update(value)
    return result


@pytest.fixture(scope="module", params=ENGINES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The module's server on each engine (see the module docstring for why a
    subprocess): a SQLite file `serve` migrates, or a fresh, migrated database in
    the session's PostgreSQL cluster. Module-scoped, so it cannot take the
    function-scoped `new_database`; it makes its database the same way."""
    engine = request.param
    directory = tmp_path_factory.mktemp(f"malformed-input-{engine}")
    if engine == "sqlite":
        url = sqlite_url(directory)
    else:
        postgres: Postgres | None = request.getfixturevalue("postgres_session")
        require(postgres is not None, "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")
        assert postgres is not None
        url = postgres.fresh_database_url()
    # Never a silent fallback to the other engine.
    assert flavour_of(parse_database_url(url)) == engine, (engine, url)
    process = Leasehold.serve(
        url,
        "--concurrency",
        "2",
        "--poll-seconds",
        "0.05",
        env={"LEASEHOLD_PAGE_TOKEN_KEY": PAGE_TOKEN_KEY},
    )
    process.start()
    svc = Service(process, url)
    try:
        yield svc
    finally:
        svc.close()
        process.kill()


@pytest.fixture
def service(served: Service) -> Service:
    served.begin()
    return served


def explore(
    service: Service,
    rpc: str,
    strategy: st.SearchStrategy[Any],
    max_examples: int,
    explicit: Sequence[Any] = (),
) -> int:
    """Run `service.check(rpc, generated)` for hypothesis-generated requests; returns
    how many examples ran."""
    ran = 0

    @settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(probe=strategy.map(lambda value: value if isinstance(value, Probe) else Probe(value)))
    def run(probe: Probe) -> None:
        nonlocal ran
        ran += 1
        service.check(rpc, probe)

    for value in explicit:
        run = example(probe=Probe(value))(run)
    run()
    return ran


# ----- generators -------------------------------------------------------------------------

ANY_CHAR = st.characters(codec="utf-8")  # every code point but surrogates, NUL included
SOME_CHARS = ["x", "é", "語", "😀", "\x00", '"', "\\", "\n"]


def text_near(*limits: int) -> st.SearchStrategy[str]:
    """Strings of one repeated character, at and around each limit."""
    lengths = sorted({0, 1, *(n + d for n in limits for d in (-1, 0, 1)), 4096})
    return st.builds(lambda n, c: c * n, st.sampled_from(lengths), st.sampled_from(SOME_CHARS))


def texts(*limits: int) -> st.SearchStrategy[str]:
    return st.one_of(st.text(ANY_CHAR, max_size=30), text_near(*limits))


def mostly(valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` three times in four, so that whole requests are often accepted too."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda good: valid if good else invalid)


def int32s(*interesting: int) -> st.SearchStrategy[int]:
    edges = {0, 1, -1, *INT32, *interesting}
    return st.one_of(st.sampled_from(sorted(edges)), st.integers(*INT32))


KINDS = mostly(
    st.just(ECHO),
    st.sampled_from(
        [
            "",
            "EXAMPLE.ECHO",
            "example.echo\x00",
            " example.echo",
            "example.echo\n",
            "example/echo",
            "exämple.echo",
            "example.unknown",
            "a" * 128,
            "a" * 129,
        ]
    )
    | st.from_regex(r"[a-z0-9._-]{1,20}", fullmatch=True)
    | st.text(ANY_CHAR, max_size=20),
)

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(),  # NaN and +-Infinity included
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**53), 2**53).map(float),
    st.text(ANY_CHAR, max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(ANY_CHAR, max_size=8), children)
    ),
    max_leaves=12,
)


def _nest(shape: list[str]) -> dict[str, Any]:
    value: Any = "leaf"
    for kind in shape:
        value = {"k": value} if kind == "d" else [value]
    return {"top": value}


# JSON depth (top object = 1) of 29..41: across the 32 limit and protobuf's own
# recursion limit of 100 messages, which a few of these pass as well.
DEEP_PAYLOADS = st.lists(st.sampled_from("dl"), min_size=28, max_size=40).map(_nest)
# One string around the 256 KiB limit, or well under it in characters that JSON escapes.
BIG_PAYLOADS = st.builds(
    lambda n, c: {"blob": c * n},
    st.one_of(st.integers(PAYLOAD_BYTES_LIMIT - 40, PAYLOAD_BYTES_LIMIT + 10), st.integers(40_000, 120_000)),
    st.sampled_from(SOME_CHARS),
)
PAYLOADS = mostly(
    st.dictionaries(st.text(ANY_CHAR, max_size=8), JSON_VALUES, max_size=5),
    DEEP_PAYLOADS | BIG_PAYLOADS,
)


def _enqueue_probe(request: jobs_pb2.EnqueueRequest, payload: dict[str, Any]) -> Probe:
    """The request with `payload` appended as raw field 4: protobuf refuses to copy a
    Struct nested past its recursion limit into a message, but serializes one fine."""
    body = request.SerializeToString() + _length_delimited(4, _struct(payload).SerializeToString())
    shown = text_format.MessageToString(request, as_one_line=True)
    return Probe(body, f"EnqueueRequest({shown} payload={payload!r})")


ENQUEUE_REQUESTS = st.builds(
    _enqueue_probe,
    st.builds(
        jobs_pb2.EnqueueRequest,
        kind=KINDS,
        resource_type=st.one_of(
            st.just(""), st.just("doc"), st.just("leasehold.schedule"), texts(RESOURCE_LIMIT)
        ),
        resource_id=st.one_of(st.just(""), texts(RESOURCE_LIMIT)),
        max_attempts=mostly(st.integers(0, MAX_ATTEMPTS_LIMIT), int32s(MAX_ATTEMPTS_LIMIT + 1)),
        timeout_seconds=mostly(st.integers(0, 100), int32s(TIMEOUT_SECONDS_LIMIT, TIMEOUT_SECONDS_LIMIT + 1)),
    ),
    PAYLOADS,
)


def _batch_probe(items: list[Probe]) -> Probe:
    """The items' exact bytes (raw payloads and all) as the batch's field 1."""
    body = b"".join(_length_delimited(1, item.request) for item in items if isinstance(item.request, bytes))
    return Probe(body, f"BatchEnqueueRequest({len(items)} items: {items!r})")


# Few items, so that an example stays cheap: each accepted job is watched to its end.
# The same resource keys come up often, so that items of one batch collide.
BATCH_ITEMS = st.one_of(
    ENQUEUE_REQUESTS,
    st.builds(
        lambda resource_id: _enqueue_probe(
            jobs_pb2.EnqueueRequest(kind=ECHO, resource_type="doc", resource_id=resource_id), {}
        ),
        st.sampled_from(["a", "b"]),
    ),
)
BATCH_ENQUEUE_REQUESTS = st.lists(BATCH_ITEMS, max_size=4).map(_batch_probe)

ODD_IDS = [
    "",
    UNKNOWN_ID,
    "job_" + "g" * 32,
    "j" * JOB_ID_LIMIT,
    "j" * (JOB_ID_LIMIT + 1),
    "é" * JOB_ID_LIMIT,
    "😀" * (JOB_ID_LIMIT + 1),
    "job_x' OR '1'='1",
    "job_%",
    "*",
    "\x00",
    "../../etc/passwd",
]


def job_ids(own: Sequence[str]) -> st.SearchStrategy[str]:
    mutations: list[Callable[[str], str]] = [
        str.upper,
        lambda s: s + " ",
        lambda s: " " + s,
        lambda s: s[:-1],
        lambda s: s + "\x00",
        lambda s: s.replace("job_", "JOB_"),
    ]
    return st.one_of(
        st.text(ANY_CHAR, max_size=40),
        st.sampled_from(ODD_IDS),
        text_near(JOB_ID_LIMIT),
        st.sampled_from(list(own)),
        st.builds(lambda i, m: m(i), st.sampled_from(list(own)), st.sampled_from(mutations)),
    )


def page_tokens(issued: Sequence[str]) -> st.SearchStrategy[str]:
    def edit(token: str, index: int) -> str:
        index %= len(token)
        return token[:index] + ("A" if token[index] != "A" else "B") + token[index + 1 :]

    return st.one_of(
        st.just(""),
        st.text(ANY_CHAR, max_size=60),
        st.from_regex(r"[A-Za-z0-9_-]{0,40}\.[A-Za-z0-9_-]{0,50}", fullmatch=True),
        st.sampled_from(list(issued)),
        st.builds(edit, st.sampled_from(list(issued)), st.integers(0, 200)),
        st.sampled_from(list(issued)).map(lambda t: t + "="),
        st.sampled_from(list(issued)).map(lambda t: t.replace(".", "..")),
        text_near(5000),
    )


# ----- raw bytes ----------------------------------------------------------------------------


def _field(number: int, wire: int, body: bytes) -> bytes:
    return _VarintBytes((number << 3) | wire) + body


def _length_delimited(number: int, body: bytes) -> bytes:
    return _field(number, 2, _VarintBytes(len(body)) + body)


@st.composite
def wire_like(draw: st.DrawFn) -> bytes:
    """Bytes shaped like protobuf: real and unknown field numbers, every wire type
    (including the invalid 6 and 7), lying lengths, invalid UTF-8, unclosed groups."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.one_of(st.integers(1, 6), st.integers(1, 2**29 - 1)))
        wire = draw(st.integers(0, 7))
        if wire == 0:
            content = _VarintBytes(draw(st.integers(0, 2**64 - 1)))
        elif wire == 1:
            content = draw(st.binary(min_size=8, max_size=8))
        elif wire == 2:
            data = draw(st.binary(max_size=20) | st.text(ANY_CHAR, max_size=10).map(str.encode))
            declared = draw(st.one_of(st.just(len(data)), st.integers(0, 2**32)))
            content = _VarintBytes(declared) + data
        elif wire == 5:
            content = draw(st.binary(min_size=4, max_size=4))
        else:
            content = b""
        parts.append(_field(number, wire, content))
    return b"".join(parts)


RAW_BODIES = st.one_of(st.binary(max_size=80), wire_like())
# Echo jobs whose payload is raw Struct bytes: unset Values, repeated map keys, a
# number and a string in one Value, wrong wire types inside the Struct.
RAW_PAYLOAD_ENQUEUES = st.builds(
    lambda payload: _length_delimited(1, ECHO.encode()) + _length_delimited(4, payload),
    st.one_of(
        wire_like(),
        st.lists(
            st.tuples(st.text(ANY_CHAR, max_size=3), wire_like()).map(
                lambda kv: _length_delimited(
                    1, _length_delimited(1, kv[0].encode()) + _length_delimited(2, kv[1])
                )
            ),
            max_size=4,
        ).map(b"".join),
    ),
)


def deep_list_payload(levels: int) -> bytes:
    """Enqueue(example.echo) whose payload is {"a": [[[...]]]}, `levels` lists deep."""
    # Value.list_value (6) -> ListValue.values (1) -> Value ..., around an empty Value.
    chain = _deep_chain(levels, (0x32, 0x0A))
    entry = _length_delimited(1, b"a") + _length_delimited(2, chain)
    return _length_delimited(1, ECHO.encode()) + _length_delimited(4, _length_delimited(1, entry))


def deep_struct_payload(levels: int) -> bytes:
    """Enqueue(example.echo) whose payload is {"a": {"a": {...}}}, `levels` objects deep."""
    # Value.struct_value=5 -> Struct.fields=1 -> FieldsEntry{key=1 "a", value=2: Value}.
    key = _length_delimited(1, b"a")
    parts = []
    length = 0
    for _ in range(levels):
        value_header = _VarintBytes(0x12) + _VarintBytes(length)  # FieldsEntry.value
        entry_len = len(key) + len(value_header) + length
        entry_header = _VarintBytes(0x0A) + _VarintBytes(entry_len)  # Struct.fields
        struct_len = len(entry_header) + entry_len
        struct_header = _VarintBytes(0x2A) + _VarintBytes(struct_len)  # Value.struct_value
        parts.append((struct_header, entry_header, key, value_header))
        length = len(struct_header) + struct_len
    chain = b"".join(b"".join(level) for level in reversed(parts))
    entry = key + _VarintBytes(0x12) + _VarintBytes(len(chain)) + chain
    return _length_delimited(1, ECHO.encode()) + _length_delimited(4, _length_delimited(1, entry))


def _deep_chain(levels: int, tags: tuple[int, ...]) -> bytes:
    """`levels` repetitions of the nested length-delimited fields `tags` (outermost
    first), around nothing."""
    headers = []
    length = 0
    for _ in range(levels):
        for tag in reversed(tags):
            header = _VarintBytes(tag) + _VarintBytes(length)
            headers.append(header)
            length += len(header)
    return b"".join(reversed(headers))


def deep_groups(levels: int) -> bytes:
    """An unknown field 15 as `levels` groups nested inside each other."""
    return _VarintBytes((15 << 3) | 3) * levels + _VarintBytes((15 << 3) | 4) * levels


def sized_body(prefix: bytes, total: int) -> bytes:
    """`prefix` plus an unknown length-delimited field 15 padding it to `total` bytes."""
    for header_guess in range(2, 8):
        padding = total - len(prefix) - header_guess
        body = prefix + _length_delimited(15, b"p" * padding)
        if len(body) == total:
            return body
    raise AssertionError(f"cannot pad to {total}")


# ----- a minimal HTTP/2 client, for header bytes grpc's client refuses to send -------------

HPACK_STATIC = [
    ":authority", ":method", ":method", ":path", ":path", ":scheme", ":scheme", ":status", ":status",
    ":status", ":status", ":status", ":status", ":status", "accept-charset", "accept-encoding",
    "accept-language", "accept-ranges", "accept", "access-control-allow-origin", "age", "allow",
    "authorization", "cache-control", "content-disposition", "content-encoding", "content-language",
    "content-length", "content-location", "content-range", "content-type", "cookie", "date", "etag",
    "expect", "expires", "from", "host", "if-match", "if-modified-since", "if-none-match", "if-range",
    "if-unmodified-since", "last-modified", "link", "location", "max-forwards", "proxy-authenticate",
    "proxy-authorization", "range", "referer", "refresh", "retry-after", "server", "set-cookie",
    "strict-transport-security", "transfer-encoding", "user-agent", "vary", "via", "www-authenticate",
]  # fmt: skip
HPACK_STATIC_VALUES = {2: "GET", 3: "POST", 4: "/", 5: "/index.html", 6: "http", 7: "https", 8: "200"}
HPACK_STATIC_VALUES.update({9: "204", 10: "206", 11: "304", 12: "400", 13: "404", 14: "500"})
HPACK_STATIC_VALUES[16] = "gzip, deflate"
FRAME_DATA, FRAME_HEADERS, FRAME_RST, FRAME_SETTINGS, FRAME_PING, FRAME_GOAWAY, FRAME_CONT = (
    0,
    1,
    3,
    4,
    6,
    7,
    9,
)
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20
# grpc's setting that lets it send -bin trailers as raw bytes, not Huffman-coded base64.
GRPC_ALLOW_TRUE_BINARY_METADATA = 0xFE03


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


class HpackDecoder:
    """Enough HPACK (RFC 7541) to read grpc's trailers: integers, the static and
    dynamic tables and raw strings. Huffman-coded strings come back as None (grpc
    sends its status and message raw)."""

    def __init__(self) -> None:
        self.table: list[tuple[bytes | None, bytes | None]] = []
        self.max_size = 4096

    def _int(self, data: bytes, i: int, prefix_bits: int) -> tuple[int, int]:
        limit = (1 << prefix_bits) - 1
        value = data[i] & limit
        i += 1
        if value < limit:
            return value, i
        shift = 0
        while True:
            byte = data[i]
            i += 1
            value += (byte & 127) << shift
            shift += 7
            if not byte & 128:
                return value, i

    def _string(self, data: bytes, i: int) -> tuple[bytes | None, int]:
        huffman = data[i] & 128
        length, i = self._int(data, i, 7)
        return (None if huffman else data[i : i + length]), i + length

    def _entry(self, index: int) -> tuple[bytes | None, bytes | None]:
        if index <= len(HPACK_STATIC):
            return HPACK_STATIC[index - 1].encode(), HPACK_STATIC_VALUES.get(index, "").encode()
        return self.table[index - len(HPACK_STATIC) - 1]

    @staticmethod
    def _size(entry: tuple[bytes | None, bytes | None]) -> int:
        return 32 + sum(len(part or b"") for part in entry)

    def _evict(self) -> None:
        while self.table and sum(map(self._size, self.table)) > self.max_size:
            self.table.pop()

    def decode(self, data: bytes) -> list[tuple[bytes | None, bytes | None]]:
        headers: list[tuple[bytes | None, bytes | None]] = []
        i = 0
        while i < len(data):
            byte = data[i]
            if byte & 0x80:  # indexed
                index, i = self._int(data, i, 7)
                headers.append(self._entry(index))
                continue
            if byte & 0xE0 == 0x20:  # table size update
                self.max_size, i = self._int(data, i, 5)
                self._evict()
                continue
            indexing = bool(byte & 0x40)
            index, i = self._int(data, i, 6 if indexing else 4)
            name: bytes | None
            if index:
                name = self._entry(index)[0]
            else:
                name, i = self._string(data, i)
            value, i = self._string(data, i)
            headers.append((name, value))
            if indexing:
                self.table.insert(0, (name, value))
                self._evict()
        return headers


@dataclass
class RawOutcome:
    grpc_status: int | None
    grpc_message: str
    status: status_pb2.Status | None
    reset: int | None  # RST_STREAM error code, when the stream was reset instead


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def raw_grpc_call(
    port: int, rpc: str, extra_headers: Sequence[tuple[bytes, bytes]], message: bytes
) -> RawOutcome:
    """One unary call over a fresh HTTP/2 connection, headers sent byte for byte."""
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", f"/{SERVICE}/{rpc}".encode()),
        (b":authority", f"127.0.0.1:{port}".encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *extra_headers,
    ]
    block = b"".join(
        b"\x00" + _hpack_int(len(k), 7) + k + _hpack_int(len(v), 7) + v for k, v in headers
    )  # literal without indexing, new name, no Huffman
    chunks = [block[i : i + 16384] for i in range(0, len(block), 16384)] or [b""]
    frames = [
        _frame(FRAME_HEADERS if n == 0 else FRAME_CONT, END_HEADERS if n == len(chunks) - 1 else 0, 1, chunk)
        for n, chunk in enumerate(chunks)
    ]
    data = b"\x00" + struct.pack(">I", len(message)) + message
    settings_payload = struct.pack(">HI", GRPC_ALLOW_TRUE_BINARY_METADATA, 1)
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT)) as sock:
        sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _frame(FRAME_SETTINGS, 0, 0, settings_payload)
            + b"".join(frames)
            + _frame(FRAME_DATA, END_STREAM, 1, data)
        )
        return _read_response(sock)


def _read_response(sock: socket.socket) -> RawOutcome:
    decoder = HpackDecoder()
    buffer = b""
    block = b""
    ends_stream = False
    fields: dict[bytes, bytes | None] = {}

    def read(n: int) -> bytes:
        nonlocal buffer
        while len(buffer) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed before the call ended; headers so far {fields}")
            buffer += chunk
        taken, buffer = buffer[:n], buffer[n:]
        return taken

    while True:
        head = read(9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        payload = read(length)
        if kind == FRAME_SETTINGS and not flags & 1:
            sock.sendall(_frame(FRAME_SETTINGS, 1, 0, b""))
        elif kind == FRAME_PING and not flags & 1:
            sock.sendall(_frame(FRAME_PING, 1, 0, payload))
        elif kind == FRAME_GOAWAY:
            raise AssertionError(f"server sent GOAWAY {payload!r}")
        elif kind == FRAME_RST and stream == 1:
            return RawOutcome(None, "", None, int.from_bytes(payload, "big"))
        elif kind in (FRAME_HEADERS, FRAME_CONT) and stream == 1:
            if kind == FRAME_HEADERS:
                if flags & PADDED:
                    payload = payload[1 : len(payload) - payload[0]]
                if flags & PRIORITY:
                    payload = payload[5:]
                ends_stream = bool(flags & END_STREAM)
            block += payload
            if flags & END_HEADERS:
                fields.update((k, v) for k, v in decoder.decode(block) if k is not None)
                block = b""
                if ends_stream:
                    return _raw_outcome(fields)


def _raw_outcome(fields: dict[bytes, bytes | None]) -> RawOutcome:
    code = fields.get(b"grpc-status")
    message = urllib.parse.unquote_to_bytes(fields.get(b"grpc-message") or b"").decode(errors="replace")
    details = fields.get(b"grpc-status-details-bin")
    status = None
    if details is not None:
        raw = details[1:] if details[:1] == b"\x00" else base64.b64decode(details + b"==")
        status = status_pb2.Status.FromString(raw)
    return RawOutcome(int(code) if code is not None else None, message, status, None)


# ===== the experiments =======================================================================


def test_enqueue_with_random_fields_gets_its_documented_status(service: Service, figures: Figures) -> None:
    """Kinds, resources, limits and Struct payloads (NaN, Infinity, unicode, NUL, 30-40
    levels deep, strings around 256 KiB): each rejection names a bad field and writes
    nothing; each acceptance runs and echoes its payload back unchanged."""
    # Deterministic anchors at the documented edges, run before the random ones.
    explicit = [
        jobs_pb2.EnqueueRequest(kind=ECHO, payload=_struct({"blob": "é" * 100_000})),  # 200 KB serialized
        jobs_pb2.EnqueueRequest(kind=ECHO, payload=_struct({"blob": "語" * 60_000})),  # 180 KB serialized
        jobs_pb2.EnqueueRequest(kind=ECHO, payload=_struct({"numbers": [i + 1 / 3 for i in range(20_000)]})),
        jobs_pb2.EnqueueRequest(kind=ECHO, resource_type="t\x00", resource_id="\x00😀"),
        # U+0000 inside payload strings and keys is stored and echoed back on both
        # engines (PostgreSQL's text and jsonb cannot hold it; its json column can).
        jobs_pb2.EnqueueRequest(kind=ECHO, payload=_struct({"k\x00": ["\x00", {"\x00": "a\x00b"}]})),
        jobs_pb2.EnqueueRequest(kind=ECHO, payload=_struct({"n": 1.7976931348623157e308, "tiny": 5e-324})),
        # The request id keys the call, so it is read first and named alone.
        jobs_pb2.EnqueueRequest(kind="", request_id="\x7f"),
    ]
    ran = explore(service, "Enqueue", ENQUEUE_REQUESTS, max_examples=150, explicit=explicit)
    service.assert_healthy()
    figures("examples", ran)
    service.report(figures, ["Enqueue"])


def test_batch_enqueue_with_random_items_gets_its_documented_status(
    service: Service, figures: Figures
) -> None:
    """Batches of 0-4 of the Enqueue experiment's items, some naming the same resource:
    a bad item refuses the whole batch, naming `requests[i].<field>` for the first bad
    one, and writes nothing; an empty batch names `requests`; an accepted batch answers
    each item as Enqueue would have, in order, and runs every job it created."""
    explicit = [
        jobs_pb2.BatchEnqueueRequest(),
        jobs_pb2.BatchEnqueueRequest(requests=[jobs_pb2.EnqueueRequest(kind=ECHO)] * (BATCH_LIMIT + 1)),
        jobs_pb2.BatchEnqueueRequest(
            requests=[
                jobs_pb2.EnqueueRequest(kind=ECHO, resource_type="doc", resource_id="twice"),
                jobs_pb2.EnqueueRequest(kind=ECHO, resource_type="doc", resource_id="twice"),
            ]
        ),
        jobs_pb2.BatchEnqueueRequest(
            requests=[jobs_pb2.EnqueueRequest(kind=ECHO), jobs_pb2.EnqueueRequest(kind=ECHO, max_attempts=-1)]
        ),
        # The batch's request id is read before its items, and an item may not carry one.
        jobs_pb2.BatchEnqueueRequest(request_id="\x00"),
        jobs_pb2.BatchEnqueueRequest(request_id="r" * (REQUEST_ID_LIMIT + 1), requests=[]),
        jobs_pb2.BatchEnqueueRequest(
            requests=[jobs_pb2.EnqueueRequest(kind=ECHO), jobs_pb2.EnqueueRequest(kind="", request_id="r")]
        ),
    ]
    ran = explore(service, "BatchEnqueue", BATCH_ENQUEUE_REQUESTS, max_examples=80, explicit=explicit)
    service.assert_healthy()
    figures("examples", ran)
    service.report(figures, ["BatchEnqueue"])


@pytest.mark.parametrize("rpc", ["Get", "Cancel", "Retry"])
def test_by_id_rpcs_with_random_ids_get_their_documented_status(
    service: Service, figures: Figures, rpc: str
) -> None:
    """Random, oversized, unicode and NUL-bearing ids, and the caller's own ids edited
    by one character: INVALID_ARGUMENT job_id, PERMISSION_DENIED naming the id, or (own
    finished job) OK / FAILED_PRECONDITION — and nothing written."""
    own = service.ensure_own_jobs(3)
    requests = job_ids(own).map(lambda job_id: REQUEST_TYPES[rpc](job_id=job_id))
    ran = explore(service, rpc, requests, max_examples=80)
    service.assert_healthy()
    figures("examples", ran)
    service.report(figures, [rpc])


def test_watch_with_random_ids_and_sequences_gets_its_documented_status(
    service: Service, figures: Figures
) -> None:
    """Random ids and after_sequence anywhere in int64 (negative, 0, past the end,
    2^63-1): INVALID_ARGUMENT, PERMISSION_DENIED, or exactly the events after it."""
    own = service.ensure_own_jobs(3)
    requests = st.builds(
        jobs_pb2.WatchEventsRequest,
        job_id=job_ids(own),
        after_sequence=st.one_of(st.sampled_from([-1, 0, 1, 3, 4, 5, *INT64]), st.integers(*INT64)),
    )
    ran = explore(service, "WatchEvents", requests, max_examples=120)
    service.assert_healthy()
    figures("examples", ran)
    service.report(figures, ["WatchEvents"])


def test_list_with_random_filters_sizes_and_tokens_gets_its_documented_status(
    service: Service, figures: Figures
) -> None:
    """Page sizes across int32, unknown and unspecified statuses, oversized filters,
    random and edited page tokens, real tokens with other filters: INVALID_ARGUMENT
    naming the field, or a page of the caller's own jobs that matches the filter."""
    service.issue_tokens()
    issued = sorted(service.tokens)
    statuses = st.lists(st.one_of(st.integers(0, 6), st.integers(*INT32)), max_size=4)
    short = st.text(ANY_CHAR, max_size=8)
    requests = st.builds(
        jobs_pb2.ListRequest,
        page_size=mostly(st.integers(0, 3), int32s(MAX_PAGE_SIZE, MAX_PAGE_SIZE + 1)),
        page_token=mostly(st.just("") | st.sampled_from(issued), page_tokens(issued)),
        statuses=mostly(st.lists(st.sampled_from(sorted(VALID_STATUSES)), max_size=3), statuses),
        kind=mostly(st.sampled_from(["", ECHO]) | short, texts(LIST_KIND_LIMIT)),
        resource_type=mostly(st.just("") | short, texts(RESOURCE_LIMIT)),
        resource_id=mostly(st.just("") | short, texts(RESOURCE_LIMIT)),
    )
    ran = explore(service, "List", requests, max_examples=150)
    service.assert_healthy()
    figures("examples", ran)
    service.report(figures, ["List"])


@pytest.mark.parametrize("rpc", RPCS)
def test_random_request_bytes_get_their_documented_status(
    service: Service, figures: Figures, rpc: str
) -> None:
    """Raw bytes as the request body (sent with identity serializers): what protobuf
    cannot decode is INVALID_ARGUMENT `request`; what it can is judged like any
    request. Never INTERNAL or UNKNOWN, nothing written."""
    service.ensure_own_jobs(3)
    bodies = RAW_BODIES if rpc != "Enqueue" else st.one_of(RAW_BODIES, RAW_PAYLOAD_ENQUEUES)
    ran = explore(service, rpc, bodies, max_examples=60)
    service.assert_healthy()
    figures("examples", ran)
    service.report(figures, [rpc])


def test_nesting_of_ten_to_the_fifth_levels_is_invalid_argument(service: Service, figures: Figures) -> None:
    """Payloads nested 10^5 lists or objects deep (built as raw protobuf bytes: the
    Python library cannot build them) and 10^5 nested unknown groups on every RPC:
    INVALID_ARGUMENT `request`, decided without crashing or stalling the server."""
    cases = [("Enqueue", "list payload", deep_list_payload(100_000))]
    cases.append(("Enqueue", "object payload", deep_struct_payload(100_000)))
    cases += [(rpc, "unknown groups", deep_groups(100_000)) for rpc in RPCS]
    slowest = 0.0
    for rpc, shape, body in cases:
        assert len(body) < GRPC_MESSAGE_CAP
        with pytest.raises(DecodeError):  # the oracle agrees: protobuf cannot decode these
            REQUEST_TYPES[rpc].FromString(body)
        began = time.monotonic()
        service.check(rpc, body, expected=_invalid("request"))
        slowest = max(slowest, time.monotonic() - began)
        figures(f"{rpc} {shape} bytes", len(body))
    # The same builders, shallow enough to decode, are understood: the bytes are right.
    service.check("Enqueue", deep_list_payload(5))
    service.check("Enqueue", deep_struct_payload(5))
    service.assert_healthy()
    figures("slowest rejection s", slowest)
    service.report(figures, RPCS)


def test_messages_over_four_mib_get_resource_exhausted(service: Service, figures: Figures) -> None:
    """A request of exactly 4 MiB reaches the handler (and gets its documented answer);
    one byte more is refused by grpc itself with RESOURCE_EXHAUSTED before any handler
    runs. docs/api.md's errors table lists RESOURCE_EXHAUSTED only for a full disk; this
    pins what a caller actually gets, and that nothing is written and the server lives."""
    prefixes = {
        "Enqueue": jobs_pb2.EnqueueRequest(kind=ECHO).SerializeToString(),
        "Get": jobs_pb2.GetRequest(job_id=UNKNOWN_ID).SerializeToString(),
        "List": jobs_pb2.ListRequest().SerializeToString(),
        "Cancel": jobs_pb2.CancelRequest(job_id=UNKNOWN_ID).SerializeToString(),
        "Retry": jobs_pb2.RetryRequest(job_id=UNKNOWN_ID).SerializeToString(),
        "WatchEvents": jobs_pb2.WatchEventsRequest(job_id=UNKNOWN_ID).SerializeToString(),
        "BatchEnqueue": jobs_pb2.BatchEnqueueRequest(
            requests=[jobs_pb2.EnqueueRequest(kind=ECHO)]
        ).SerializeToString(),
    }
    for rpc, prefix in prefixes.items():
        at_cap = sized_body(prefix, GRPC_MESSAGE_CAP)
        service.check(rpc, at_cap)  # unknown field 15 is skipped: the prefix decides
        over = sized_body(prefix, GRPC_MESSAGE_CAP + 1)
        digest = service.digest()
        outcome = service.call(rpc, over)
        assert outcome.code == Code.RESOURCE_EXHAUSTED, (rpc, outcome.code, outcome.details)
        assert "larger than max" in outcome.details, outcome.details
        assert service.digest() == digest
    # A huge but legal-size request body: a 4 MiB Enqueue with everything oversized.
    huge = jobs_pb2.EnqueueRequest(kind=ECHO, payload=_struct({"blob": "x" * (3 * 1024 * 1024)}))
    service.check("Enqueue", huge)
    service.assert_healthy()
    service.report(figures, RPCS)


OWNER_KEYS = ["x-owner-id", "x-owner-id-bin", "x-owner", "owner-id", "x-owner-idx", "authorization"]
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
OWNER_VALUES = st.one_of(
    st.from_regex(r"[A-Za-z0-9._:@-]{1,128}", fullmatch=True),
    st.text(PRINTABLE, max_size=140),
    st.builds(
        lambda n, c: c * n, st.sampled_from([0, 1, 128, 129, 8192, 32768, 60000]), st.sampled_from("a: ")
    ),
)


@st.composite
def owner_metadata_sets(draw: st.DrawFn) -> list[tuple[str, str | bytes]]:
    pairs: list[tuple[str, str | bytes]] = []
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(OWNER_KEYS))
        value: str | bytes = draw(st.binary(max_size=40)) if key.endswith("-bin") else draw(OWNER_VALUES)
        pairs.append((key, value))
    # Keep the whole under grpc's hard 64 KiB limit on metadata (raised from its
    # default so that an 8 KB owner reaches the resolver); past it grpc itself refuses.
    while sum(len(key) + len(value) for key, value in pairs) > 61_000:
        pairs.pop()
    return pairs


OWNER_PROBES: dict[str, tuple[bytes, Expected]] = {
    # A request per RPC that, with a good owner, gets a known answer and writes nothing.
    "Enqueue": (jobs_pb2.EnqueueRequest(kind="").SerializeToString(), _invalid("kind")),
    "Get": (
        jobs_pb2.GetRequest(job_id=UNKNOWN_ID).SerializeToString(),
        Expected(Code.PERMISSION_DENIED, job_id=UNKNOWN_ID),
    ),
    "List": (jobs_pb2.ListRequest(page_size=1).SerializeToString(), _ok()),
    "Cancel": (
        jobs_pb2.CancelRequest(job_id=UNKNOWN_ID).SerializeToString(),
        Expected(Code.PERMISSION_DENIED, job_id=UNKNOWN_ID),
    ),
    "Retry": (
        jobs_pb2.RetryRequest(job_id=UNKNOWN_ID).SerializeToString(),
        Expected(Code.PERMISSION_DENIED, job_id=UNKNOWN_ID),
    ),
    "WatchEvents": (
        jobs_pb2.WatchEventsRequest(job_id=UNKNOWN_ID, after_sequence=-1).SerializeToString(),
        _invalid("after_sequence"),
    ),
    "BatchEnqueue": (
        jobs_pb2.BatchEnqueueRequest(requests=[jobs_pb2.EnqueueRequest(kind="")]).SerializeToString(),
        _invalid("requests[0].kind"),
    ),
}


def test_owner_header_variants_get_unauthenticated_unless_exactly_one_valid(
    service: Service, figures: Figures
) -> None:
    """Missing, empty, repeated, 8-60 KB, wrong-key, `-bin` and invalid-character owner
    headers on every RPC: UNAUTHENTICATED (OWNER_UNRESOLVED) before the request is
    looked at, unless exactly one `x-owner-id` of 1-128 allowed characters is sent."""
    ran = 0

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(rpc=st.sampled_from(RPCS), metadata=owner_metadata_sets())
    @example(rpc="Get", metadata=[])
    @example(rpc="Get", metadata=[(OWNER_HEADER, "")])
    @example(rpc="Get", metadata=[(OWNER_HEADER, OWNER), (OWNER_HEADER, OWNER)])
    @example(rpc="Get", metadata=[(OWNER_HEADER, "a" * 8192)])
    @example(rpc="Get", metadata=[(OWNER_HEADER + "-bin", b"\xff\x00alice")])
    @example(rpc="Get", metadata=[(OWNER_HEADER, b"alice")])
    def run(rpc: str, metadata: list[tuple[str, str | bytes]]) -> None:
        nonlocal ran
        ran += 1
        values = [value for key, value in metadata if key == OWNER_HEADER]
        decoded = [v.decode() if isinstance(v, bytes) else v for v in values]
        body, good_owner = OWNER_PROBES[rpc]
        valid = len(decoded) == 1 and OWNER_PATTERN.fullmatch(decoded[0]) is not None
        expected = good_owner if valid else Expected(Code.UNAUTHENTICATED)
        service.check(rpc, body, metadata, expected=expected)

    run()
    service.assert_healthy()
    figures("examples", ran)
    service.report(figures, RPCS)


RAW_OWNER_VALUES = st.one_of(
    st.binary(max_size=40),
    st.text(ANY_CHAR, max_size=20).map(str.encode),
    st.sampled_from(
        [b"alice", "ålice".encode(), b"al\xffice", b"al\x00ice", b"al\r\nice", b"\talice", b"alice\x7f"]
    ),
    st.builds(lambda n: b"\xc3\xa9" * n, st.integers(60, 4000)),
)


def test_owner_header_bytes_grpc_clients_refuse_to_send_are_unauthenticated(
    service: Service, figures: Figures
) -> None:
    """Header values no grpc client sends (non-ASCII, invalid UTF-8, NUL, CR/LF, DEL),
    written byte for byte over a raw HTTP/2 connection: UNAUTHENTICATED with
    OWNER_UNRESOLVED, unless the bytes are exactly one valid owner."""
    ran = 0
    codes: Counter[str] = Counter()

    @settings(max_examples=120, deadline=None)
    @given(
        values=st.lists(RAW_OWNER_VALUES, max_size=2),
        binary=st.lists(st.binary(max_size=30), max_size=1),
    )
    def run(values: list[bytes], binary: list[bytes]) -> None:
        nonlocal ran
        ran += 1
        # A -bin value travels base64-encoded on the wire, whatever bytes it carries.
        encoded = [base64.b64encode(v).rstrip(b"=") for v in binary]
        headers = [(b"x-owner-id", v) for v in values] + [(b"x-owner-id-bin", v) for v in encoded]
        valid = len(values) == 1 and OWNER_PATTERN_BYTES.fullmatch(values[0]) is not None
        digest = service.digest()
        outcome = raw_grpc_call(
            service.port, "Get", headers, jobs_pb2.GetRequest(job_id=UNKNOWN_ID).SerializeToString()
        )
        codes[str(outcome.grpc_status if outcome.reset is None else f"RST {outcome.reset}")] += 1
        assert outcome.reset is None, f"{headers}: stream reset {outcome.reset}"
        expected = Code.PERMISSION_DENIED if valid else Code.UNAUTHENTICATED
        assert outcome.grpc_status == expected.value[0], (headers, outcome)
        assert outcome.status is not None and outcome.status.code == outcome.grpc_status
        (info,) = _detail(outcome.status, error_details_pb2.ErrorInfo)
        assert info.reason == ("JOB_NOT_ACCESSIBLE" if valid else "OWNER_UNRESOLVED"), (headers, outcome)
        assert service.digest() == digest

    run()
    # What breaks HTTP/2 or grpc's wire format itself -- a header name HTTP/2 forbids
    # (upper case, NUL), a -bin value that is not base64 -- never reaches Leasehold:
    # grpc's transport answers on its own (today with INTERNAL). Recorded, not
    # promised; what is asserted is that no Leasehold code ran and the server lives.
    transport_errors = {
        "upper-case name": [(b"X-Owner-Id", b"alice")],
        "NUL in name": [(b"x-owner\x00-id", b"alice")],
        "-bin value not base64": [(b"x-owner-id", b"alice"), (b"x-owner-id-bin", b"\x01")],
    }
    for what, headers in transport_errors.items():
        digest = service.digest()
        outcome = raw_grpc_call(service.port, "Get", headers, b"")
        assert outcome.status is None, f"{what}: reached the service: {outcome}"
        assert service.digest() == digest
        figures(f"{what}: grpc transport's status", f"{outcome.grpc_status} {outcome.grpc_message}")
    service.assert_healthy()
    figures("examples", ran)
    figures("raw requests by grpc-status", ", ".join(f"{code} {n}" for code, n in sorted(codes.items())))


# ----- page tokens signed with the service's own key ---------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed_token(body: bytes, owner: str = OWNER) -> str:
    """A token with a valid signature (the test knows LEASEHOLD_PAGE_TOKEN_KEY): what
    a server of another version sharing the key might have issued."""
    signature = hmac.new(PAGE_TOKEN_KEY.encode(), owner.encode() + b"\0" + body, hashlib.sha256).digest()
    return f"{_b64(body)}.{_b64(signature)}"


NO_FILTER_DIGEST = hashlib.sha256(json.dumps([[], "", "", ""]).encode()).hexdigest()[:16]
MALFORMED_SIGNED_BODIES = {
    "not JSON": b"not json",
    "not UTF-8": b"\xff\xfe",
    "empty": b"",
    "a list": b"[]",
    "null": b"null",
    "a string": b'"job_x"',
    "no fields": b"{}",
    "no filter digest": b'{"j":"job_x"}',
    "no cursor": json.dumps({"f": NO_FILTER_DIGEST}).encode(),
    "filter digest not a string": b'{"j":"job_x","f":["x"]}',
}


def test_signed_but_malformed_page_token_is_invalid_argument(service: Service, figures: Figures) -> None:
    """Tokens that carry a valid signature but a body the service cannot read (another
    version's format under a shared LEASEHOLD_PAGE_TOKEN_KEY, or a key that leaked):
    still a bad page token, INVALID_ARGUMENT `page_token`, never INTERNAL."""
    # Control: a well-formed signed token is accepted (a cursor nobody owns: empty page).
    service.check(
        "List",
        jobs_pb2.ListRequest(
            page_token=_signed_token(json.dumps({"j": "job_x", "f": NO_FILTER_DIGEST}).encode())
        ),
        expected=_ok(),
    )
    failures = []
    for name, body in MALFORMED_SIGNED_BODIES.items():
        request = jobs_pb2.ListRequest(page_token=_signed_token(body))
        try:
            service.check("List", request, expected=_invalid("page_token"))
        except AssertionError:
            outcome = service.call("List", request.SerializeToString())
            failures.append(
                f"signed token whose body is {name} ({body!r}): {outcome.code.name} {outcome.details!r}"
            )
    figures("malformed signed tokens", len(MALFORMED_SIGNED_BODIES))
    figures("answered other than INVALID_ARGUMENT", len(failures))
    service.report(figures, ["List"])
    service.assert_serving()
    assert not failures, "\n".join(failures)

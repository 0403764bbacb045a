"""Every RPC of the four services, fed requests hypothesis builds from the
protos themselves (any field, any value: long and odd strings, out-of-range
timestamps, huge lists, unknown enum numbers) and raw bytes, with the right
credential and with a wrong one, against a real `serve --auth token` process.

What must hold for each call, whatever it carries:
- never INTERNAL or UNKNOWN: every bad input has a status that says so;
- an INVALID_ARGUMENT names the field (a `BadRequest` violation) and its
  message stays short, whatever the input's size (no echo of a long value);
- the answer's trailer stays small (no status that quotes the input back);
- afterwards the server is healthy and has logged no error.

The deeper oracle for JobService (which status each input gets) is in
test_malformed_input.py; this one covers the breadth of the surface."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, message_factory, struct_pb2, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasehold.v1 import admin_pb2, jobs_pb2, schedules_pb2, worker_pb2
from tests.credentials import bearer, token_file
from tests.support import sqlite_url
from tests.system.helpers import Leasehold

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NEVER = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
# Well above any message the service writes, far below the inputs sent.
MESSAGE_BOUND = 1_000
TRAILER_BOUND = 4_096
CALL_TIMEOUT = 5.0
# A Claim may wait for work and a stream for events: their deadline is not an error,
# and a shorter one keeps the many requests they accept from costing 5 s each.
MAY_WAIT = frozenset(
    {
        "/leasehold.v1.WorkerService/Claim",
        "/leasehold.v1.JobService/WatchEvents",
        "/leasehold.v1.JobService/Subscribe",
    }
)
WAIT_TIMEOUT = 2.0
ROLES = {
    "leasehold.v1.JobService": "owner",
    "leasehold.v1.ScheduleService": "owner",
    "leasehold.v1.WorkerService": "worker",
    "leasehold.v1.AdminService": "admin",
}
METHODS = [
    (service.full_name, method)
    for module in (jobs_pb2, schedules_pb2, worker_pb2, admin_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]

EVERY_RPC = pytest.mark.parametrize(
    ("service", "method"), METHODS, ids=[f"{s.rsplit('.', 1)[-1]}.{m.name}" for s, m in METHODS]
)


@dataclass
class Served:
    channel: grpc.Channel
    credentials: dict[str, tuple[tuple[str, str], ...]]
    server: Leasehold


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory: Path = tmp_path_factory.mktemp("fuzz")
    path, (owner, worker, admin) = token_file(directory / "tokens", "owner:fuzz", "worker", "admin")
    server = Leasehold.serve(
        sqlite_url(directory),
        *("--auth", "token", "--token-file", str(path), "--remote-kinds", "remote.*"),
    )
    port = server.start()
    credentials = {"owner": bearer(owner), "worker": bearer(worker), "admin": bearer(admin)}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Served(channel, credentials, server)
    finally:
        server.kill()


# ----- requests built from the descriptors ------------------------------------------

_LONG_TEXTS = [n * "x" for n in (129, 257, 1_025, 70_000)]
_ODD_TEXTS = ["", "\x00", "a\x00b", "²", "😀" * 40, "../../etc/passwd", "remote.a", "example.echo", " "]
TEXTS = st.one_of(st.text(max_size=40), st.sampled_from(_LONG_TEXTS), st.sampled_from(_ODD_TEXTS))
# Good values for the fields validated first, drawn often, so that a request
# gets past them to the checks behind (a bad kind would hide a bad time zone).
FIELD_HINTS = {
    "kind": ["example.echo", "remote.a"],
    "kinds": ["example.echo", "remote.a"],
    "schedule_id": ["nightly"],
    "cron": ["* * * * *", "30 2 * 3 0#2", "0 0 31 2 *", "*/5 * * * *"],
    "time_zone": ["UTC", "America/New_York"],
    "resource_type": ["doc"],
    "resource_id": ["1"],
    "worker_id": ["fuzz-worker"],
    "event_type": ["progress"],
    "owner_id": ["fuzz"],
    "request_id": ["r1"],
}
_INT_RANGES = {
    descriptor.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    descriptor.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    descriptor.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    descriptor.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    descriptor.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    descriptor.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    descriptor.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(-3, 1_100), st.sampled_from([low, high, 0, 2**31 - 1]).filter(lambda n: low <= n <= high)
    )


def _timestamps() -> st.SearchStrategy[timestamp_pb2.Timestamp]:
    # Far outside what a datetime holds, as well as ordinary times.
    seconds = st.one_of(st.integers(0, 4_102_444_800), st.integers(-(2**62), 2**62))
    return st.builds(
        lambda s, n: timestamp_pb2.Timestamp(seconds=s, nanos=n), seconds, st.integers(-5, 10**9 + 5)
    )


def _structs() -> st.SearchStrategy[struct_pb2.Struct]:
    def build(values: dict[str, Any]) -> struct_pb2.Struct:
        message = struct_pb2.Struct()
        message.update(values)
        return message

    return st.dictionaries(st.text(max_size=8), JSON, max_size=4).map(build)


def _value(field: descriptor.FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == descriptor.FieldDescriptor.TYPE_STRING:
        hints = FIELD_HINTS.get(field.name)
        return st.one_of(st.sampled_from(hints), st.sampled_from(hints), *TEXTS.branches) if hints else TEXTS
    if kind == descriptor.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == descriptor.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (descriptor.FieldDescriptor.TYPE_DOUBLE, descriptor.FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32 if kind == field.TYPE_FLOAT else 64)
    if kind == descriptor.FieldDescriptor.TYPE_ENUM:
        return st.integers(-2, 12)  # unknown numbers too: proto3 enums are open
    if kind in _INT_RANGES:
        return _integers(*_INT_RANGES[kind])
    full_name = field.message_type.full_name
    if full_name == "google.protobuf.Timestamp":
        return _timestamps()
    if full_name == "google.protobuf.Struct":
        return _structs()
    return messages(field.message_type, depth + 1)


def _short(value: Any) -> bool:
    """Not one of the longest texts (a list of a thousand stays under 2 MB)."""
    return not isinstance(value, str | bytes) or len(value) <= 1_025


def messages(message: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of this type with any subset of its fields set to anything."""
    cls = message_factory.GetMessageClass(message)
    if depth > 2:
        return st.just(cls())
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in message.fields:
        value = _value(field, depth)
        if field.is_repeated:
            fields[field.name] = st.one_of(
                st.lists(value, max_size=3),
                # A few values drawn, cycled to 101-1,001 entries: the list's
                # length is what is under test. Drawing a thousand values per
                # field made an example slow, and a thousand 70,000-character
                # strings make a request past gRPC's 4 MiB, which the transport
                # refuses before the service sees it.
                st.integers(101, 1_001).flatmap(
                    lambda n, v=value: st.lists(v.filter(_short), min_size=1, max_size=3).map(
                        lambda drawn, n=n: (drawn * n)[:n]
                    )
                )
                if depth == 0 and field.type != field.TYPE_MESSAGE
                else st.just([]),
            )
        else:
            fields[field.name] = value

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        # Hinted fields mostly set (to reach what is behind them), the rest at random.
        chosen = {
            name for name in sorted(fields) if draw(st.integers(0, 3)) < (3 if name in FIELD_HINTS else 2)
        }
        built = cls()
        for name in sorted(chosen):
            value = draw(fields[name])
            target = getattr(built, name)
            if isinstance(value, list):
                target.extend(value)
            elif isinstance(value, Message):
                target.CopyFrom(value)
            else:
                setattr(built, name, value)
        return built

    return build()


# ----- the checks -----------------------------------------------------------------------


def _call(
    served: Served, path: str, body: bytes, metadata: tuple[tuple[str, str], ...], stream: bool
) -> grpc.RpcError | None:
    """One call with raw bytes; None when it answered OK."""
    identity = lambda raw: raw  # noqa: E731
    timeout = WAIT_TIMEOUT if path in MAY_WAIT else CALL_TIMEOUT
    try:
        if stream:
            call = served.channel.unary_stream(path, identity, identity)(
                body, metadata=metadata, timeout=timeout
            )
            for _ in call:
                call.cancel()  # one answer is enough: the request was understood
                break
        else:
            served.channel.unary_unary(path, identity, identity)(body, metadata=metadata, timeout=timeout)
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.CANCELLED:  # the cancel above
            return None
        return error
    return None


def _judge(path: str, error: grpc.RpcError | None) -> None:
    if error is None:
        return
    code = error.code()
    assert code not in NEVER, f"{path}: {code.name}: {error.details()}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        assert path in MAY_WAIT, f"{path} took longer than {CALL_TIMEOUT} s"
        return
    details = error.details() or ""
    assert len(details) <= MESSAGE_BOUND, f"{path}: a {len(details)}-character message"
    trailers = dict(error.trailing_metadata() or ())
    raw_status = trailers.get("grpc-status-details-bin", b"")
    assert len(raw_status) <= TRAILER_BOUND, f"{path}: a {len(raw_status)}-byte status"
    # Every refusal is Leasehold's own, with its rich status: not one gRPC made
    # up on the way (such as RESOURCE_EXHAUSTED for a trailer over its limit).
    assert raw_status, f"{path}: {code.name} without a status detail: {details}"
    status = status_pb2.Status.FromString(raw_status)
    assert status.code == code.value[0], f"{path}: {code.name} but the detail says {status.code}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        violations = [
            violation
            for detail in status.details
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR)
            for violation in _bad_request(detail).field_violations
        ]
        assert violations and all(v.field for v in violations), f"{path}: {details}"


def _bad_request(detail: Any) -> error_details_pb2.BadRequest:
    request = error_details_pb2.BadRequest()
    detail.Unpack(request)
    return request


@EVERY_RPC
def test_any_request_to_any_rpc_gets_a_documented_status(
    served: Served, service: str, method: descriptor.MethodDescriptor
) -> None:
    path = f"/{service}/{method.name}"
    right = served.credentials[ROLES[service]]
    wrong = served.credentials["worker" if ROLES[service] != "worker" else "owner"]
    bodies = st.one_of(
        messages(method.input_type).map(lambda m: m.SerializeToString()), st.binary(max_size=64)
    )

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(body=bodies, metadata=st.sampled_from([right, right, right, wrong, ()]))
    def check(body: bytes, metadata: tuple[tuple[str, str], ...]) -> None:
        _judge(path, _call(served, path, body, metadata, method.server_streaming))

    check()
    health = health_pb2_grpc.HealthStub(served.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    errors = [record for record in served.server.records if record.get("level") == "error"]
    assert errors == []


def _plausible(message: descriptor.Descriptor, depth: int = 0) -> Message:
    """A request of this type with every hinted string field set to a good value,
    in nested messages too: the base the sweep below spoils one field of."""
    built = message_factory.GetMessageClass(message)()
    for field in message.fields:
        hints = FIELD_HINTS.get(field.name)
        if field.type == field.TYPE_STRING and hints:
            if field.is_repeated:
                getattr(built, field.name).append(hints[0])
            else:
                setattr(built, field.name, hints[0])
        elif field.type == field.TYPE_MESSAGE and not field.is_repeated and depth < 2:
            if field.message_type.full_name.startswith("leasehold."):
                getattr(built, field.name).CopyFrom(_plausible(field.message_type, depth + 1))
    return built


def _string_paths(message: descriptor.Descriptor, depth: int = 0) -> Iterator[tuple[str, ...]]:
    for field in message.fields:
        if field.type == field.TYPE_STRING:
            yield (field.name,)
        elif field.type == field.TYPE_MESSAGE and not field.is_repeated and depth < 2:
            if field.message_type.full_name.startswith("leasehold."):
                for rest in _string_paths(field.message_type, depth + 1):
                    yield (field.name, *rest)


def _spoiled(base: Message, path: tuple[str, ...], text: str) -> Message:
    request = type(base)()
    request.CopyFrom(base)
    target = request
    for name in path[:-1]:
        target = getattr(target, name)
    field = target.DESCRIPTOR.fields_by_name[path[-1]]
    if field.is_repeated:
        values = getattr(target, path[-1])
        del values[:]
        values.append(text)
    else:
        setattr(target, path[-1], text)
    return request


@EVERY_RPC
def test_a_long_value_in_any_string_field_is_refused_without_being_echoed(
    served: Served, service: str, method: descriptor.MethodDescriptor
) -> None:
    """Every string field, nested ones too, one at a time, holding 70,000
    characters in an otherwise plausible request: a short refusal naming it (a
    time zone or cron quoted back whole once made the trailer too big for
    gRPC, which answered RESOURCE_EXHAUSTED instead)."""
    path = f"/{service}/{method.name}"
    base = _plausible(method.input_type)
    for field_path in _string_paths(method.input_type):
        body = _spoiled(base, field_path, "x" * 70_000).SerializeToString()
        error = _call(served, path, body, served.credentials[ROLES[service]], method.server_streaming)
        _judge(path, error)

"""Experiment 11 — another owner learns nothing and changes nothing (DESIGN §2 owner
identity and status codes, docs/api.md "Errors").

The promise: for every RPC, owner B gets the same answer for owner A's job as for an id
that does not exist — same status code, same message (`job <id> not found or not
accessible`), same trailing metadata down to the bytes of grpc-status-details-bin — so
B cannot even learn that A's id exists; B's List never shows A's jobs; and nothing B
does changes A's jobs or their event logs.

How: owner A (in-process app on a real port and a real database, on each engine;
the `test.gate` kind holding jobs running on purpose) gets a job in every state —
queued, queued retry, running, running with a cancel requested, succeeded, failed,
cancelled. Owner B then calls Get, Cancel, Retry and WatchEvents (after_sequence 0,
1, 2, 5, 1000, 2^63-1 and -1) with each of A's ids, with unknown well-formed ids,
near misses of A's ids and malformed ids (among them A's id and an unknown one with
a NUL appended, INVALID_ARGUMENT alike on both engines), and List filtered by A's
resources, kinds and statuses and with A's page token. Every answer is reduced to
a signature with the id abstracted (the message's id replaced inside the parsed
rich status); each RPC must produce exactly one signature per argument class. The
bytes are also compared raw between A's id and an unknown id of the same length.
A's rows and events are read from the database, and A's jobs from the API, before
and after: equal.

Response times are recorded (medians for A's ids and for unknown ids) but not
asserted: on two noisy cores with a group-commit writer in the path of Cancel and Retry,
a timing assertion would measure the machine, not the service.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2

from leasehold._server.app import LeaseholdApp
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests import database_reads
from tests.api.helpers import (
    by_id_call,
    enqueue,
    get_job,
    list_all,
    start_gate_job,
    wait_for_event,
    wait_for_terminal,
)
from tests.reliability.conftest import Figures
from tests.support import OTHER_OWNER, OWNER, Gate, owner_metadata

Stub = jobs_pb2_grpc.JobServiceStub
A, B = OWNER, OTHER_OWNER
BY_ID_RPCS = ("Get", "Cancel", "Retry", "WatchEvents")
AFTER_SEQUENCES = (0, 1, 2, 5, 1000, 2**63 - 1)
DETAILS_BIN = "grpc-status-details-bin"
ID_PLACEHOLDER = "<ID>"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def runtime_settings() -> RuntimeSettings:
    """Two slots, both held by A's gate jobs, so A's queued jobs stay queued while B
    probes. A 30 s lease keeps heartbeats (which touch only lease_expires_at) rare."""
    return RuntimeSettings(concurrency=2, lease_seconds=30, poll_seconds=0.05)


# ----- what B observes ----------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """Everything a caller can see of one failed call."""

    code: grpc.StatusCode
    details: str
    initial: tuple[tuple[str, str | bytes], ...]
    trailing: tuple[tuple[str, str | bytes], ...]
    seconds: float


async def observe(awaitable: Awaitable[Any]) -> Observation:
    began = time.monotonic()
    try:
        await awaitable
    except grpc.aio.AioRpcError as err:
        return Observation(
            err.code(),
            err.details() or "",
            tuple(err.initial_metadata() or ()),
            tuple(err.trailing_metadata() or ()),
            time.monotonic() - began,
        )
    raise AssertionError("the call succeeded; a denial was expected")


def signature(observation: Observation, job_id: str) -> tuple[Any, ...]:
    """The observation with the probed id abstracted away, exactly: the message must be
    the documented one for that id, and inside grpc-status-details-bin the parsed
    Status's message is replaced by the template and re-serialized; every other byte
    is kept."""
    details = observation.details
    denial = f"job {job_id} not found or not accessible"
    if observation.code == grpc.StatusCode.PERMISSION_DENIED:
        assert details == denial, (details, job_id)
        details = f"job {ID_PLACEHOLDER} not found or not accessible"
    assert job_id not in details or not job_id, (job_id, details)

    def normal(key: str, value: str | bytes) -> tuple[str, str | bytes]:
        if key != DETAILS_BIN:
            return key, value
        assert isinstance(value, bytes)
        status = status_pb2.Status.FromString(value)
        assert status.message == observation.details and status.code == observation.code.value[0]
        assert status.SerializeToString() == value, "details are not canonically encoded"
        status.message = details
        return key, status.SerializeToString()

    return (
        observation.code,
        details,
        tuple(normal(k, v) for k, v in observation.initial),
        tuple(normal(k, v) for k, v in observation.trailing),
    )


def swapped(observation: Observation, old: str, new: str) -> tuple[Any, ...]:
    """The raw observation with one id replaced by another of the same length, byte
    for byte (no parsing): what `old`'s denial would be if ids were the only difference."""
    assert len(old.encode()) == len(new.encode())

    def swap(value: str | bytes) -> str | bytes:
        if isinstance(value, bytes):
            return value.replace(old.encode(), new.encode())
        return value.replace(old, new)

    return (
        observation.code,
        swap(observation.details),
        tuple((k, swap(v)) for k, v in observation.initial),
        tuple((k, swap(v)) for k, v in observation.trailing),
    )


def raw(observation: Observation) -> tuple[Any, ...]:
    return (observation.code, observation.details, observation.initial, observation.trailing)


# ----- what A owns, as stored ------------------------------------------------------------


@dataclass
class OwnerState:
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    api: dict[str, bytes] = field(default_factory=dict)


async def snapshot(app: LeaseholdApp, stub: Stub, owner: str) -> OwnerState:
    """The owner's rows (every column but lease_expires_at, which heartbeats renew) and
    event rows straight from the database, and each job as the owner's Get shows it."""
    url = app.settings.database_url
    rows = [
        tuple(value for column, value in row.items() if column != "lease_expires_at")
        for row in database_reads.rows(
            url, "SELECT * FROM jobs WHERE owner_id = :owner ORDER BY seq", owner=owner
        )
    ]
    events = [
        tuple(row.values())
        for row in database_reads.rows(
            url,
            "SELECT e.* FROM job_events e JOIN jobs j ON j.id = e.job_id"
            " WHERE j.owner_id = :owner ORDER BY e.job_id, e.sequence",
            owner=owner,
        )
    ]
    ids = [job.id for job in await list_all(stub, owner=owner)]
    api = {job_id: (await get_job(stub, job_id, owner=owner)).SerializeToString() for job_id in ids}
    return OwnerState(rows, events, api)


@dataclass
class OwnerJobs:
    by_state: dict[str, jobs_pb2.Job]
    resources: list[tuple[str, str]]
    token: str  # a List page token issued to A


async def jobs_in_every_state(stub: Stub) -> OwnerJobs:
    """A's jobs: one per state, deterministically (no sleeps; each wait is on an event)."""
    succeeded = (await enqueue(stub, "example.echo", owner=A, resource_type="doc", resource_id="a-1")).job
    failed = (
        await enqueue(
            stub,
            "example.fail",
            {"message": "boom"},
            owner=A,
            max_attempts=1,
            resource_type="doc",
            resource_id="a-2",
        )
    ).job
    await wait_for_terminal(stub, succeeded.id, owner=A)
    await wait_for_terminal(stub, failed.id, owner=A)
    # Both slots now taken by gate jobs that wait for the test: what follows stays queued.
    running = await start_gate_job(stub, owner=A, resource_type="gate", resource_id="a-3")
    cancel_requested = await start_gate_job(stub, {"check_cancel": True}, owner=A)
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=cancel_requested.id), metadata=owner_metadata(A))
    await wait_for_event(stub, cancel_requested.id, "job.cancel_requested", owner=A)
    cancelled = (await enqueue(stub, "example.echo", owner=A)).job
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=cancelled.id), metadata=owner_metadata(A))
    queued = (
        await enqueue(
            stub, "example.echo", {"secret": "A's"}, owner=A, resource_type="doc", resource_id="a-4"
        )
    ).job
    retry = (await stub.Retry(jobs_pb2.RetryRequest(job_id=failed.id), metadata=owner_metadata(A))).job

    by_state = {
        "succeeded": succeeded,
        "failed": failed,
        "running": running,
        "running, cancel requested": cancel_requested,
        "cancelled": cancelled,
        "queued": queued,
        "queued retry": retry,
    }
    expected = {
        "succeeded": jobs_pb2.JOB_STATUS_SUCCEEDED,
        "failed": jobs_pb2.JOB_STATUS_FAILED,
        "running": jobs_pb2.JOB_STATUS_RUNNING,
        "running, cancel requested": jobs_pb2.JOB_STATUS_RUNNING,
        "cancelled": jobs_pb2.JOB_STATUS_CANCELLED,
        "queued": jobs_pb2.JOB_STATUS_QUEUED,
        "queued retry": jobs_pb2.JOB_STATUS_QUEUED,
    }
    for state, job in by_state.items():
        current = await get_job(stub, job.id, owner=A)
        assert current.status == expected[state], (state, current)
        by_state[state] = current
    assert by_state["running, cancel requested"].HasField("cancel_requested_at")
    assert by_state["queued retry"].retry_of_job_id == failed.id
    page = await stub.List(jobs_pb2.ListRequest(page_size=1), metadata=owner_metadata(A))
    assert page.next_page_token
    resources = [("doc", "a-1"), ("doc", "a-2"), ("gate", "a-3"), ("doc", "a-4")]
    return OwnerJobs(by_state, resources, page.next_page_token)


def unknown_ids(a_ids: list[str]) -> dict[str, list[str]]:
    """Ids B might try, by how they are made. All within the 256-character limit."""
    near_misses = []
    for job_id in a_ids:
        last = "0" if job_id[-1] != "0" else "1"
        near_misses.append(job_id[:-1] + last)
    edits: list[Callable[[str], str]] = [
        str.upper,
        lambda s: s + " ",
        lambda s: " " + s,
        lambda s: s[:-1],
        lambda s: s + "%",
        lambda s: s.replace("job_", "job-"),
    ]
    return {
        "random well-formed": [f"job_{secrets.token_hex(16)}" for _ in range(5)],
        "one character off an id of A": near_misses,
        "an id of A, edited": [edit(job_id) for job_id in a_ids[:2] for edit in edits],
        "malformed": [
            "x",
            "job_",
            "job_*",
            "%",
            "' OR owner_id != '' --",
            "😀",
            "j" * 256,
            f"{a_ids[0]}' OR '1'='1",
        ],
    }


def invalid_class(job_id: str) -> str:
    """Which kind of invalid argument `job_id` is: one answer per kind."""
    if not job_id:
        return "empty job_id"
    return "job_id with NUL" if "\x00" in job_id else "oversized job_id"


# ===== the experiment ===================================================================


async def test_another_owner_learns_nothing_and_changes_nothing(
    app: LeaseholdApp, stub: Stub, gate: Gate, figures: Figures
) -> None:
    """Per RPC, one response for every id B cannot see, byte-identical between A's ids
    and unknown ones; B's List never shows A's jobs; A's jobs and logs are untouched."""
    owned = await jobs_in_every_state(stub)
    a_ids = [job.id for job in owned.by_state.values()]
    # B has a job of its own, on the very resource key of one of A's jobs: dedup is
    # per owner, so this is a new job and not a window onto A's.
    b_job = await enqueue(stub, "example.echo", owner=B, resource_type="doc", resource_id="a-1")
    assert b_job.created and b_job.job.id not in a_ids
    before = await snapshot(app, stub, A)
    assert len(before.api) == len(a_ids) and len(before.events) > len(a_ids)

    others = unknown_ids(a_ids)
    probes = 0
    # (rpc, class of argument) -> signatures seen, each with the first id that drew it;
    # "denied" mixes A's ids and unknown ones.
    signatures: dict[tuple[str, str], dict[tuple[Any, ...], str]] = defaultdict(dict)

    def note(key: tuple[str, str], seen: Observation, job_id: str) -> None:
        signatures[key].setdefault(signature(seen, job_id), job_id)

    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    reference = others["random well-formed"][0]  # same length as A's ids
    # A NUL is malformed whoever asks (PostgreSQL text cannot hold one, so every
    # engine refuses it): A's id with one appended is answered like an unknown id
    # with one, and both like any other invalid argument.
    invalid_ids = ["", "j" * 257, a_ids[0] + "j" * 230, "x" * 10_000, a_ids[0] + "\x00", reference + "\x00"]

    for rpc in BY_ID_RPCS:
        afters = AFTER_SEQUENCES if rpc == "WatchEvents" else (0,)
        for after in afters:
            unknown_seen = await observe(by_id_call(stub, rpc, reference, B, after))
            for job_id in a_ids:
                seen = await observe(by_id_call(stub, rpc, job_id, B, after))
                probes += 1
                assert seen.code == grpc.StatusCode.PERMISSION_DENIED, (rpc, job_id, seen)
                assert any(key == DETAILS_BIN for key, _ in seen.trailing)
                # Byte for byte, with nothing parsed: A's id answered exactly like an unknown one.
                assert raw(unknown_seen) == swapped(seen, job_id, reference), (rpc, after, job_id)
                note((rpc, "denied"), seen, job_id)
                times[(rpc, "ids of A")].append(seen.seconds)
            for ids in others.values():
                for job_id in ids:
                    seen = await observe(by_id_call(stub, rpc, job_id, B, after))
                    probes += 1
                    note((rpc, "denied"), seen, job_id)
                    times[(rpc, "unknown ids")].append(seen.seconds)
        # Arguments that are invalid whoever asks: one answer, A's id or not.
        for job_id in invalid_ids:
            seen = await observe(by_id_call(stub, rpc, job_id, B))
            probes += 1
            assert seen.code == grpc.StatusCode.INVALID_ARGUMENT, (rpc, job_id, seen)
            note((rpc, invalid_class(job_id)), seen, job_id)
        if rpc == "WatchEvents":
            for job_id in [*a_ids, *others["random well-formed"]]:
                seen = await observe(by_id_call(stub, rpc, job_id, B, after=-1))
                probes += 1
                assert seen.code == grpc.StatusCode.INVALID_ARGUMENT, (job_id, seen)
                note((rpc, "negative after_sequence"), seen, job_id)

    # List as B: filtered by every resource, kind and status of A's jobs, and unfiltered.
    b_ids = {b_job.job.id}
    filters: list[dict[str, Any]] = [{}]
    filters += [{"resource_type": t, "resource_id": i} for t, i in owned.resources]
    filters += [{"resource_type": t} for t in {t for t, _ in owned.resources}]
    filters += [{"kind": kind} for kind in ("example.echo", "example.fail", "test.gate")]
    filters += [{"statuses": [status]} for status in range(1, 6)]
    for list_filter in filters:
        shown = {job.id for job in await list_all(stub, owner=B, **list_filter)}
        probes += 1
        assert shown <= b_ids, (list_filter, shown)
        assert not shown & set(a_ids)
    assert {job.id for job in await list_all(stub, owner=B, resource_type="doc", resource_id="a-1")} == b_ids
    # A's page token, presented by B, is refused exactly like a token nobody issued.
    forged = owned.token[:-2] + ("AA" if owned.token[-2:] != "AA" else "BB")
    for token in (owned.token, forged):
        seen = await observe(
            stub.List(jobs_pb2.ListRequest(page_size=1, page_token=token), metadata=owner_metadata(B))
        )
        probes += 1
        assert seen.code == grpc.StatusCode.INVALID_ARGUMENT, seen
        note(("List", "page token"), seen, token)

    after_state = await snapshot(app, stub, A)
    assert after_state.rows == before.rows, "B changed a row of A's"
    assert after_state.events == before.events, "B changed an event log of A's"
    assert after_state.api == before.api, "A's jobs read differently after B's probes"
    assert {job.id for job in await list_all(stub, owner=B)} == b_ids

    figures("probes made", probes)
    figures(
        "ids: A's / unknown / invalid",
        f"{len(a_ids)} / {sum(map(len, others.values()))} / {len(invalid_ids)}",
    )
    for (rpc, kind), seen_signatures in sorted(signatures.items()):
        figures(f"{rpc} {kind}: distinct responses", len(seen_signatures))
    for rpc in BY_ID_RPCS:
        a_median = statistics.median(times[(rpc, "ids of A")]) * 1000
        unknown_median = statistics.median(times[(rpc, "unknown ids")]) * 1000
        figures(f"{rpc} median ms, A's ids / unknown", f"{a_median:.2f} / {unknown_median:.2f}")
    # Each answer that differs, with an id that drew it.
    differing = {
        key: [(found[0].name, found[1], job_id) for found, job_id in seen.items()]
        for key, seen in signatures.items()
        if len(seen) != 1
    }
    assert differing == {}, differing
    gate.release.set()

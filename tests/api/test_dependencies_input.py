"""What Enqueue and BatchEnqueue refuse of a graph of jobs (DESIGN §18), over
gRPC on each database: every mistake is INVALID_ARGUMENT naming the field
(`depends_on[j]`, `requests[i].depends_on_refs[j]` ...) and writes nothing; a
parent id that names no job of the caller's gets the same answer, byte for
byte, whether nobody has it or another owner does."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from leasehold._server.jobs.dependencies import MAX_PARENTS
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import enqueue, error_reason, expect_error, expect_invalid, struct
from tests.database_reads import scalar
from tests.support import OTHER_OWNER, OWNER, owner_metadata

Stub = jobs_pb2_grpc.JobServiceStub

UNKNOWN_ID = "job_" + "f" * 32


def item(
    kind: str = "example.echo", payload: dict[str, Any] | None = None, **fields: Any
) -> jobs_pb2.EnqueueRequest:
    return jobs_pb2.EnqueueRequest(kind=kind, payload=struct(payload), **fields)


def batch_call(
    stub: Stub, items: list[jobs_pb2.EnqueueRequest], *, owner: str = OWNER, request_id: str = ""
) -> Any:
    request = jobs_pb2.BatchEnqueueRequest(requests=items, request_id=request_id)
    return stub.BatchEnqueue(request, metadata=owner_metadata(owner))


async def stored(database_url: str) -> tuple[int, int, int]:
    """(jobs, job events, request ids) in the whole database, every owner's."""
    counts = []
    for table in ("jobs", "job_events", "request_ids"):
        counts.append(await asyncio.to_thread(scalar, database_url, f"SELECT count(*) FROM {table}"))
    return counts[0], counts[1], counts[2]


def later() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    return stamp


def ids(count: int) -> list[str]:
    """`count` distinct well-formed ids (checked for their form before any lookup)."""
    return [f"job_{index:032x}" for index in range(count)]


# ----- one request's own fields --------------------------------------------------------------

# (case, EnqueueRequest fields, the field named): refused alike alone and as a
# batch's item (there under `requests[i].`).
ITEM_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("101 parents", {"depends_on": ids(MAX_PARENTS + 1)}, "depends_on"),
    ("an empty parent id", {"depends_on": [UNKNOWN_ID, ""]}, "depends_on[1]"),
    ("a parent id of 257 characters", {"depends_on": ["j" * 257]}, "depends_on[0]"),
    ("a parent id with NUL", {"depends_on": ["job_\x00"]}, "depends_on[0]"),
    ("a parent named twice", {"depends_on": [*ids(2), ids(1)[0]]}, "depends_on[2]"),
    ("an unknown failure policy", {"on_parent_failure": 7}, "on_parent_failure"),
    ("a negative failure policy", {"on_parent_failure": -1}, "on_parent_failure"),
]


@pytest.mark.parametrize(
    ("fields", "field"), [case[1:] for case in ITEM_CASES], ids=[case[0] for case in ITEM_CASES]
)
async def test_a_bad_dependency_field_is_refused_alone_and_in_a_batch(stub, app, database_url, fields, field):
    before = await stored(database_url)

    alone = await expect_invalid(stub.Enqueue(item(**fields), metadata=owner_metadata()), field)
    in_batch = await expect_invalid(
        batch_call(stub, [item(ref="a"), item(depends_on_refs=["a"]), item(**fields)]), f"requests[2].{field}"
    )

    assert alone.details().startswith(f"{field}: ")
    assert in_batch.details() == f"requests[2].{alone.details()}"
    assert error_reason(alone) == error_reason(in_batch) == "INVALID_ARGUMENT"
    assert await stored(database_url) == before


async def test_a_hundred_parents_pass_the_count(stub, app, database_url):
    """The limit is 100, not fewer: the refusal that comes is the lookup's,
    naming the first id (none of these is a job), not the count's."""
    err = await expect_invalid(
        stub.Enqueue(item(depends_on=ids(MAX_PARENTS)), metadata=owner_metadata()), "depends_on[0]"
    )

    assert "100" not in err.details()
    assert await stored(database_url) == (0, 0, 0)


@pytest.mark.parametrize(
    ("field", "fields"), [("ref", {"ref": "a"}), ("depends_on_refs", {"depends_on_refs": ["a"]})]
)
async def test_refs_on_a_plain_enqueue_are_refused(stub, app, database_url, field, fields):
    err = await expect_invalid(stub.Enqueue(item(**fields), metadata=owner_metadata()), field)

    assert "BatchEnqueue" in err.details()
    assert await stored(database_url) == (0, 0, 0)


# ----- a batch's graph ------------------------------------------------------------------------


def refs(ref: str, *parents: str, **fields: Any) -> jobs_pb2.EnqueueRequest:
    return item(ref=ref, depends_on_refs=list(parents), **fields)


GRAPH_CASES: list[tuple[str, list[jobs_pb2.EnqueueRequest], str]] = [
    ("a ref naming no item", [refs("a"), refs("b", "a", "c")], "requests[1].depends_on_refs[1]"),
    ("a ref naming an item without a ref", [item(), refs("b", "")], "requests[1].depends_on_refs[0]"),
    ("an item depending on itself", [refs("a"), refs("b", "a", "b")], "requests[1].depends_on_refs[1]"),
    ("a ref named twice", [refs("a"), refs("b", "a", "a")], "requests[1].depends_on_refs[1]"),
    ("two items with one ref", [refs("a"), refs("b"), refs("a")], "requests[2].ref"),
    ("a ref with a space", [refs("a"), refs("b c")], "requests[1].ref"),
    ("a ref of 129 characters", [refs("r" * 129)], "requests[0].ref"),
    ("a cycle of two", [refs("a", "b"), refs("b", "a")], "requests[0].depends_on_refs"),
    (
        "a cycle of three after a sound chain",
        [refs("x"), refs("y", "x"), refs("a", "y", "c"), refs("b", "a"), refs("c", "b")],
        "requests[2].depends_on_refs",
    ),
    (
        "101 parents between depends_on and depends_on_refs",
        [
            *(refs(f"p{i}") for i in range(41)),
            refs("child", *(f"p{i}" for i in range(41)), depends_on=ids(60)),
        ],
        "requests[41].depends_on_refs",
    ),
]


@pytest.mark.parametrize(
    ("items", "field"), [case[1:] for case in GRAPH_CASES], ids=[case[0] for case in GRAPH_CASES]
)
async def test_a_bad_graph_refuses_the_batch_naming_the_field_and_writes_nothing(
    stub, app, database_url, items, field
):
    existing = await enqueue(stub, run_at=later())  # stays queued: its log does not grow meanwhile
    before = await stored(database_url)

    err = await expect_invalid(batch_call(stub, items, request_id="graph-1"), field)

    assert err.details().startswith(f"{field}: ")
    assert await stored(database_url) == before
    # Nothing was kept of the call either: the same request id acts anew once fixed.
    fixed = [item(), item(depends_on=[existing.job.id])]
    assert len((await batch_call(stub, fixed, request_id="graph-1")).responses) == 2


async def test_a_refused_graph_is_refused_again_with_the_same_words(stub, app):
    """Which item is named depends on the request alone, not on timing."""
    items = [refs("a", "c"), refs("b", "a"), refs("c", "b")]

    first = await expect_error(batch_call(stub, items), grpc.StatusCode.INVALID_ARGUMENT)
    again = await expect_error(batch_call(stub, items), grpc.StatusCode.INVALID_ARGUMENT)

    assert first.details() == again.details() == "requests[0].depends_on_refs: makes a cycle of dependencies"


async def test_an_item_is_checked_on_its_own_before_the_graph(stub, app):
    """A batch with a bad item and a bad graph names the item: the refs are
    resolved only among items that are sound on their own."""
    items = [refs("a", "b"), refs("b", "a"), item(max_attempts=-1)]

    await expect_invalid(batch_call(stub, items), "requests[2].max_attempts")


# ----- a parent that is not the caller's ---------------------------------------------------


def _observed(err: grpc.aio.AioRpcError, swap: tuple[str, str] | None = None) -> dict[str, Any]:
    """Everything the caller sees of a refusal, with one job id swapped for
    another of the same length (so two ids' answers can be compared whole)."""

    def swapped(value: Any) -> Any:
        if swap is None:
            return value
        old, new = swap
        if isinstance(value, bytes):
            return value.replace(old.encode(), new.encode())
        return value.replace(old, new) if isinstance(value, str) else value

    return {
        "code": err.code(),
        "details": swapped(err.details()),
        "initial": [(key, swapped(value)) for key, value in (err.initial_metadata() or ())],
        "trailing": [(key, swapped(value)) for key, value in (err.trailing_metadata() or ())],
    }


async def test_another_owners_parent_and_an_unknown_one_get_the_same_answer(stub, app, database_url):
    theirs = (await enqueue(stub, owner=OTHER_OWNER, run_at=later())).job.id
    mine = (await enqueue(stub, run_at=later())).job.id
    assert len(theirs) == len(UNKNOWN_ID)
    before = await stored(database_url)

    async def refused(parent: str, place: int) -> dict[str, Any]:
        parents = [mine, parent] if place else [parent]
        err = await expect_invalid(enqueue(stub, depends_on=parents), f"depends_on[{place}]")
        return _observed(err, (parent, UNKNOWN_ID))

    async def refused_in_batch(parent: str) -> dict[str, Any]:
        items = [item(ref="a"), item(depends_on=[mine, parent], depends_on_refs=["a"])]
        err = await expect_invalid(batch_call(stub, items), "requests[1].depends_on[1]")
        return _observed(err, (parent, UNKNOWN_ID))

    for place in (0, 1):
        foreign = await refused(theirs, place)
        unknown = await refused(UNKNOWN_ID, place)
        assert any(key == "grpc-status-details-bin" for key, _ in foreign["trailing"])
        assert foreign == unknown
    assert await refused_in_batch(theirs) == await refused_in_batch(UNKNOWN_ID)
    assert await stored(database_url) == before

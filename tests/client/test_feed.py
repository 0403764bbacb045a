"""`Client.subscribe` against the real service: the events of the caller's jobs
with their kind and resource, the filters as the service applies them, a feed
that outlives its server (killed, or drained, and started again on the same
file and port) with every event exactly once, and the refusals no retry can
change raised at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from datetime import timedelta

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from leasehold._server.app import LeaseholdApp
from leasehold.client import Client, RetryOptions
from leasehold.v1 import jobs_pb2
from tests.client.test_feed_reconnects import CountedRetry
from tests.postgres_cluster import free_port
from tests.support import OTHER_OWNER, OWNER
from tests.system.helpers import Leasehold

pytestmark = pytest.mark.timeout(120)

WAIT_SECONDS = 30.0
LEASE = "6"  # the shortest lease: a killed server's job runs again soon after the restart
# One try per call: what bounds reaching the service must not bound a feed
# that rides through a restart.
ONE_TRY = RetryOptions(deadline_seconds=0, max_backoff_seconds=0.5)
LIFECYCLE = ["job.queued", "job.started", "echo", "job.succeeded"]

Response = jobs_pb2.SubscribeResponse


async def take(client: Client, count: int, **options: object) -> list[Response]:
    """The first `count` responses of a feed, then leave it."""
    got: list[Response] = []
    async with asyncio.timeout(WAIT_SECONDS):
        async with contextlib.aclosing(client.subscribe(**options)) as feed:
            async for response in feed:
                got.append(response)
                if len(got) == count:
                    break
    return got


async def finished(client: Client, kind: str = "example.echo", **fields: str) -> str:
    """A job run to its end (watched), so its events are all in the feed."""
    job = (await client.enqueue(kind, {"text": "hi"}, **fields)).job
    async with asyncio.timeout(WAIT_SECONDS):
        events = [event.type async for event in client.watch(job.id)]
    assert events[-1] == "job.succeeded", events
    return job.id


def seen_as(responses: list[Response]) -> list[tuple[str, int, str]]:
    return [(r.event.job_id, r.event.sequence, r.event.type) for r in responses]


# ----- against the service in this process ------------------------------------------


async def test_subscribe_yields_the_events_of_enqueued_jobs_with_their_kind_and_resource(
    app: LeaseholdApp,
) -> None:
    async with Client(f"127.0.0.1:{app.port}", owner=OWNER) as client:
        first = await finished(client, resource_type="invoice", resource_id="42")
        second = await finished(client)
        got = await take(client, 8)
    async with Client(f"127.0.0.1:{app.port}", owner=OTHER_OWNER) as other:
        await finished(other)
        (theirs,) = await take(other, 1)

    assert seen_as(got) == [(first, n + 1, kind) for n, kind in enumerate(LIFECYCLE)] + [
        (second, n + 1, kind) for n, kind in enumerate(LIFECYCLE)
    ]
    assert {(r.kind, r.resource_type, r.resource_id) for r in got[:4]} == {("example.echo", "invoice", "42")}
    assert {(r.kind, r.resource_type, r.resource_id) for r in got[4:]} == {("example.echo", "", "")}
    positions = [r.position for r in got]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert theirs.event.job_id not in {first, second}  # each owner's feed is its own


async def test_the_filters_reach_the_service(app: LeaseholdApp) -> None:
    async with Client(f"127.0.0.1:{app.port}", owner=OWNER) as client:
        echo = await finished(client, resource_type="invoice", resource_id="1")
        await finished(client, "example.sleep")
        await finished(client)  # an echo with no resource
        last_echo = await finished(client, resource_type="invoice", resource_id="2")

        by_kind = await take(client, 1, kinds=["example.sleep"], event_types=["job.succeeded"])
        by_type = await take(client, 3, kinds=["example.echo"], event_types=["job.succeeded"])
        by_resource = await take(client, 2, resource_type="invoice", event_types=("echo",))
        resumed = await take(client, 1, event_types=["job.queued"], after_position=by_type[0].position)

    assert [(r.kind, r.event.type) for r in by_kind] == [("example.sleep", "job.succeeded")]
    assert [(r.kind, r.event.type) for r in by_type] == [("example.echo", "job.succeeded")] * 3
    assert [(r.event.job_id, r.event.type) for r in by_resource] == [(echo, "echo"), (last_echo, "echo")]
    assert [r.event.type for r in resumed] == ["job.queued"]
    assert resumed[0].position > by_type[0].position


async def test_a_malformed_position_raises_at_once(app: LeaseholdApp) -> None:
    retry = CountedRetry(deadline_seconds=30, max_backoff_seconds=0.05)
    async with Client(f"127.0.0.1:{app.port}", owner=OWNER, retry=retry) as client:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await take(client, 1, after_position="not-a-position")

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "after_position" in (raised.value.details() or "")
    assert retry.slept == []  # no backoff taken: never retried


async def test_an_expired_position_raises_out_of_range_naming_where_to_resume(app: LeaseholdApp) -> None:
    retry = CountedRetry(deadline_seconds=30, max_backoff_seconds=0.05)
    async with Client(f"127.0.0.1:{app.port}", owner=OWNER, retry=retry) as client:
        await finished(client)
        (stored,) = await take(client, 1)
        assert app.repository is not None
        # Retention as the service runs it, with everything finished counted as old.
        assert await app.repository.delete_expired(app.clock.now() + timedelta(seconds=1), 100) == 1
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await take(client, 1, after_position=stored.position)

    assert raised.value.code() == grpc.StatusCode.OUT_OF_RANGE
    status = rpc_status.from_call(raised.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "FEED_POSITION_EXPIRED"
    assert info.metadata["oldest_position"] in (raised.value.details() or "")
    assert retry.slept == []


# ----- across a restart of `leasehold serve` ----------------------------------------


def serve_on(database_url: str, port: int, *extra: str) -> Leasehold:
    listen = ("--database-url", database_url, "--listen", f"127.0.0.1:{port}", "--lease-seconds", LEASE)
    return Leasehold("serve", *listen, *extra)


async def follow_until(
    client: Client, seen: list[Response], cut: asyncio.Event, cut_after: int, done: asyncio.Event
) -> None:
    async for response in client.subscribe():
        seen.append(response)
        if len(seen) == cut_after:
            cut.set()
        if response.event.type == "job.succeeded":
            done.set()


def kill(server: Leasehold) -> None:
    server.kill()


def drain(server: Leasehold) -> None:
    server.interrupt(timeout=20, signum=signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "flags"), [(kill, ()), (drain, ("--shutdown-grace", "0.2"))], ids=["sigkill", "sigterm"]
)
async def test_the_feed_resumes_across_a_restart_with_every_event_exactly_once(
    database_url: str,
    processes: Callable[[Leasehold], Leasehold],
    caplog: pytest.LogCaptureFixture,
    stop: Callable[[Leasehold], None],
    flags: tuple[str, ...],
) -> None:
    caplog.set_level(logging.INFO, logger="leasehold.client")
    port = free_port()
    first = processes(serve_on(database_url, port, *flags))
    first.start()
    async with Client(f"127.0.0.1:{port}", owner=OWNER, retry=ONE_TRY) as client:
        job = (await client.enqueue("example.sleep", {"seconds": 4, "steps": 8})).job
        seen: list[Response] = []
        cut, done = asyncio.Event(), asyncio.Event()
        following = asyncio.create_task(follow_until(client, seen, cut, 4, done))
        try:
            await asyncio.wait_for(cut.wait(), WAIT_SECONDS)
            await asyncio.to_thread(stop, first)
            before = len(seen)
            processes(serve_on(database_url, port)).start()
            await asyncio.wait_for(done.wait(), 60)
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        replayed = await take(client, len(seen))

    assert 4 <= before < len(seen)  # the stream broke mid-job and went on afterwards
    assert [r.event.sequence for r in seen] == list(range(1, len(seen) + 1))
    assert {r.event.job_id for r in seen} == {job.id}
    assert seen[-1].event.type == "job.succeeded"
    # Exactly the feed as the restarted service keeps it: nothing skipped, nothing twice.
    assert [r.position for r in seen] == [r.position for r in replayed]
    # One line for the break, naming the last position handed out before it (a
    # response still in flight when the server stopped may have come after `before`).
    notices = [record.getMessage() for record in caplog.records if record.name == "leasehold.client"]
    (notice,) = notices
    resumed_after = notice.removeprefix(f"reconnected to 127.0.0.1:{port}, resuming after position ")
    assert resumed_after in [r.position for r in seen[before - 1 : -1]], notice

"""`serve --metrics-listen`: a real server's /metrics, scraped over HTTP and read
with prometheus-client's own parser, moves as the work does.

The server runs on a manual clock and the work is done by a remote worker over
WorkerService, so every step (claim, complete, fail, a lease running out) happens
exactly when the test says, and waits and run times are exact.
"""

from __future__ import annotations

import asyncio
import secrets
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from prometheus_client.parser import text_string_to_metric_families

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import ManualClock
from leasehold._server.config import Settings
from leasehold._server.metrics.queue import QUEUE_READ_INTERVAL_SECONDS
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.api.helpers import WAIT, enqueue, expect_error, struct, wait_for_terminal
from tests.support import OTHER_OWNER, OWNER, owner_metadata, sqlite_url, test_registry

TOKEN = secrets.token_urlsafe(24)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
REMOTE = "remote.work"
LEASE = 6.0
JOBS = "leasehold.v1.JobService"
WORKERS = "leasehold.v1.WorkerService"
# Planted in a payload and a result: neither may reach the metrics text.
PAYLOAD_SECRET = f"payload-secret-{secrets.token_hex(8)}"
RESULT_SECRET = f"result-secret-{secrets.token_hex(8)}"


@dataclass
class Served:
    app: LeaseholdApp
    clock: ManualClock
    stub: jobs_pb2_grpc.JobServiceStub
    worker: worker_pb2_grpc.WorkerServiceStub

    @property
    def metrics_url(self) -> str:
        assert self.app.metrics_server is not None
        return f"http://127.0.0.1:{self.app.metrics_server.port}/metrics"

    async def text(self) -> str:
        """One scrape, from a thread: the server answers it on its own thread
        while this loop (the app's) makes the queue read."""
        return await asyncio.to_thread(_get, self.metrics_url)

    async def scrape(self) -> Scrape:
        return Scrape(await self.text())

    async def claim(self, kind: str = REMOTE) -> worker_pb2.ClaimedJob:
        request = worker_pb2.ClaimRequest(worker_id="w-metrics", kinds=[kind], wait_seconds=WAIT)
        (claimed,) = (await self.worker.Claim(request, metadata=AUTH)).jobs
        return claimed


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        body: bytes = response.read()
        return body.decode()


class Scrape:
    """The samples of one scrape, by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def __call__(self, name: str, **labels: str) -> float:
        """A sample's value; 0 for a labelled child never created."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples


def settings_for(database_url: str, **extra: Any) -> Settings:
    return Settings(
        database_url=database_url,
        listen="127.0.0.1:0",
        runtime=RuntimeSettings(concurrency=2, lease_seconds=LEASE, poll_seconds=0.05),
        remote_kinds=("remote.*",),
        worker_token=TOKEN,
        metrics_listen="127.0.0.1:0",
        # The remote kinds these tests count: a `remote.*` kind is `other` unless named.
        metrics_kinds=(REMOTE, "remote.queue"),
        **extra,
    )


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[Served]:
    clock = ManualClock()
    app = LeaseholdApp(settings_for(database_url), clock=clock, registry=test_registry())
    port = await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Served(
                app, clock, jobs_pb2_grpc.JobServiceStub(channel), worker_pb2_grpc.WorkerServiceStub(channel)
            )
    finally:
        await app.stop(grace_seconds=0.5)


def lease_of(claimed: worker_pb2.ClaimedJob) -> dict[str, str]:
    return {"job_id": claimed.job.id, "lease_token": claimed.lease_token}


# ----- counters and histograms kept in process -------------------------------------------------


async def test_enqueue_success_failure_and_cancel_each_move_their_counter(served: Served) -> None:
    before = await served.scrape()
    assert before("leasehold_jobs_enqueued_total", kind=REMOTE) == 0
    assert before("leasehold_job_wait_seconds_count") == 0

    done = await enqueue(served.stub, REMOTE, {"secret": PAYLOAD_SECRET})
    assert (await served.scrape())("leasehold_jobs_enqueued_total", kind=REMOTE) == 1
    served.clock.advance(2)
    claimed = await served.claim()
    served.clock.advance(3)
    await served.worker.Complete(
        worker_pb2.CompleteRequest(**lease_of(claimed), result=struct({"answer": RESULT_SECRET})),
        metadata=AUTH,
    )
    after_success = await served.scrape()
    assert claimed.job.id == done.job.id
    assert after_success("leasehold_jobs_finished_total", kind=REMOTE, status="succeeded") == 1
    assert after_success("leasehold_job_wait_seconds_count") == 1
    assert after_success("leasehold_job_wait_seconds_sum") == 2.0  # due -> claimed
    assert after_success("leasehold_job_run_seconds_count") == 1
    assert after_success("leasehold_job_run_seconds_sum") == 3.0  # claimed -> completed

    # Two failed attempts: the first is retried, the second ends the job failed.
    await enqueue(served.stub, REMOTE, max_attempts=2)
    for attempt in (1, 2):
        claimed = await served.claim()
        await served.worker.Fail(
            worker_pb2.FailRequest(**lease_of(claimed), error_message="boom", retry_after_seconds=1),
            metadata=AUTH,
        )
        failed = await served.scrape()
        assert failed("leasehold_attempts_failed_total", kind=REMOTE) == attempt
        assert failed("leasehold_jobs_finished_total", kind=REMOTE, status="failed") == attempt - 1
        served.clock.advance(2)  # past the retry's delay

    queued = await enqueue(served.stub, REMOTE)
    cancel = jobs_pb2.CancelRequest(job_id=queued.job.id)
    await served.stub.Cancel(cancel, metadata=owner_metadata())
    served.clock.advance(1)
    await served.stub.Cancel(cancel, metadata=owner_metadata())  # already cancelled: not a second finish

    final = await served.scrape()
    assert final("leasehold_jobs_finished_total", kind=REMOTE, status="cancelled") == 1
    assert final("leasehold_jobs_finished_total", kind=REMOTE, status="succeeded") == 1
    assert final("leasehold_jobs_finished_total", kind=REMOTE, status="failed") == 1
    assert final("leasehold_jobs_enqueued_total", kind=REMOTE) == 3
    assert final("leasehold_grpc_requests_total", method=f"{JOBS}/Enqueue", code="OK") == 3
    assert final("leasehold_grpc_requests_total", method=f"{JOBS}/Cancel", code="OK") == 2
    assert final("leasehold_grpc_requests_total", method=f"{WORKERS}/Complete", code="OK") == 1
    assert final("leasehold_grpc_requests_total", method=f"{WORKERS}/Fail", code="OK") == 2
    for planted in (PAYLOAD_SECRET, RESULT_SECRET, OWNER, TOKEN):
        assert planted not in final.text


async def test_the_in_process_runtime_is_counted_too(served: Served) -> None:
    response = await enqueue(served.stub, "example.echo", {"secret": PAYLOAD_SECRET})
    await wait_for_terminal(served.stub, response.job.id)

    scrape = await served.scrape()
    assert scrape("leasehold_jobs_enqueued_total", kind="example.echo") == 1
    assert scrape("leasehold_jobs_finished_total", kind="example.echo", status="succeeded") == 1
    assert scrape("leasehold_job_wait_seconds_count") == 1
    assert scrape("leasehold_job_run_seconds_count") == 1
    assert PAYLOAD_SECRET not in scrape.text


async def test_a_repeated_request_id_is_counted_as_one_enqueue(served: Served) -> None:
    for _ in range(2):
        await enqueue(served.stub, REMOTE, max_attempts=1, request_id="metrics-1")
        batch = jobs_pb2.BatchEnqueueRequest(
            requests=[jobs_pb2.EnqueueRequest(kind=REMOTE)] * 2, request_id="metrics-2"
        )
        await served.stub.BatchEnqueue(batch, metadata=owner_metadata())
    assert (await served.scrape())("leasehold_jobs_enqueued_total", kind=REMOTE) == 3
    claimed = await served.claim()
    await served.worker.Fail(
        worker_pb2.FailRequest(**lease_of(claimed), error_message="boom", non_retryable=True), metadata=AUTH
    )

    for _ in range(2):
        retry = jobs_pb2.RetryRequest(job_id=claimed.job.id, request_id="metrics-3")
        await served.stub.Retry(retry, metadata=owner_metadata())

    assert (await served.scrape())("leasehold_jobs_enqueued_total", kind=REMOTE) == 4


async def test_a_lease_expiry_and_then_the_lost_leases_write_are_counted(served: Served) -> None:
    await enqueue(served.stub, REMOTE)
    claimed = await served.claim()
    served.clock.advance(LEASE + 1)  # the worker went quiet past its lease
    assert served.app.rescuer is not None
    await served.app.rescuer.run_once()  # (or the runtime's own claim got there first)

    expired = await served.scrape()
    assert expired("leasehold_lease_expired_total", kind=REMOTE) == 1
    assert expired("leasehold_stale_writes_rejected_total") == 0

    # The worker comes back and reports: fencing refuses the stale write.
    await expect_error(
        served.worker.Complete(worker_pb2.CompleteRequest(**lease_of(claimed)), metadata=AUTH),
        grpc.StatusCode.ABORTED,
    )
    stale = await served.scrape()
    assert stale("leasehold_stale_writes_rejected_total") == 1
    assert stale("leasehold_grpc_requests_total", method=f"{WORKERS}/Complete", code="ABORTED") == 1
    assert stale("leasehold_lease_expired_total", kind=REMOTE) == 1  # recovered once
    assert stale("leasehold_jobs_finished_total", kind=REMOTE, status="succeeded") == 0


async def test_an_attempt_past_its_timeout_is_a_failed_attempt_not_a_lease_expiry(served: Served) -> None:
    """A remote worker that keeps its lease but runs past the job's timeout: the
    rescuer ends the attempt, which counts as failed, as an in-process timeout
    does (the executor reports that one itself)."""
    await enqueue(served.stub, REMOTE, timeout_seconds=2)
    await served.claim()
    served.clock.advance(3)  # past the timeout, inside the lease
    assert served.app.rescuer is not None
    await served.app.rescuer.run_once()

    scrape = await served.scrape()
    assert scrape("leasehold_attempts_failed_total", kind=REMOTE) == 1
    assert scrape("leasehold_lease_expired_total", kind=REMOTE) == 0
    assert scrape("leasehold_jobs_finished_total", kind=REMOTE, status="failed") == 0  # retried


async def test_every_rpc_is_counted_by_method_and_final_code(served: Served) -> None:
    unknown = jobs_pb2.GetRequest(job_id="00000000-0000-0000-0000-000000000000")
    await expect_error(served.stub.Get(unknown, metadata=owner_metadata()), grpc.StatusCode.PERMISSION_DENIED)
    await expect_error(served.stub.Get(unknown), grpc.StatusCode.UNAUTHENTICATED)  # no owner
    await expect_error(enqueue(served.stub, "no.such.kind"), grpc.StatusCode.INVALID_ARGUMENT)
    await expect_error(
        served.stub.Get(jobs_pb2.GetRequest(job_id=""), metadata=owner_metadata()),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    mine = await enqueue(served.stub, REMOTE)
    await expect_error(
        served.stub.Get(jobs_pb2.GetRequest(job_id=mine.job.id), metadata=owner_metadata(OTHER_OWNER)),
        grpc.StatusCode.PERMISSION_DENIED,
    )

    scrape = await served.scrape()
    get = f"{JOBS}/Get"
    assert scrape("leasehold_grpc_requests_total", method=get, code="PERMISSION_DENIED") == 2
    assert scrape("leasehold_grpc_requests_total", method=get, code="UNAUTHENTICATED") == 1
    assert scrape("leasehold_grpc_requests_total", method=get, code="INVALID_ARGUMENT") == 1
    assert scrape("leasehold_grpc_requests_total", method=f"{JOBS}/Enqueue", code="INVALID_ARGUMENT") == 1
    assert scrape("leasehold_grpc_requests_total", method=f"{JOBS}/Enqueue", code="OK") == 1
    assert OTHER_OWNER not in scrape.text


# ----- watch streams ------------------------------------------------------------------------


async def test_the_watch_stream_gauge_counts_open_streams(served: Served) -> None:
    job_id = (await enqueue(served.stub, REMOTE)).job.id  # stays queued: its streams stay open
    request = jobs_pb2.WatchEventsRequest(job_id=job_id)
    calls = [served.stub.WatchEvents(request, metadata=owner_metadata()) for _ in range(2)]
    for call in calls:
        first = await asyncio.wait_for(call.read(), WAIT)  # the stream is open and following
        assert first.event.type == "job.queued"
    assert (await served.scrape())("leasehold_watch_streams") == 2

    calls[0].cancel()
    await until(served, lambda s: s("leasehold_watch_streams") == 1)
    calls[1].cancel()
    closed = await until(served, lambda s: s("leasehold_watch_streams") == 0)
    assert closed("leasehold_grpc_requests_total", method=f"{JOBS}/WatchEvents", code="CANCELLED") == 2


async def until(served: Served, holds: Any, timeout: float = WAIT) -> Scrape:
    """Scrape until `holds(scrape)`: a stream's end reaches the server a moment
    after the client cancels it."""
    async with asyncio.timeout(timeout):
        while True:
            scrape = await served.scrape()
            if holds(scrape):
                return scrape
            await asyncio.sleep(0.02)


# ----- the queue, read from the database ------------------------------------------------------


async def test_queue_depth_and_oldest_age_come_from_one_read_per_interval(served: Served) -> None:
    assert served.app.observed is not None
    for _ in range(3):
        await enqueue(served.stub, "remote.queue")
    served.clock.advance(4)
    await enqueue(served.stub, "remote.queue")
    await enqueue(served.stub, "remote.queue", run_at=_in(served.clock, 3600))  # not due: not counted
    served.clock.advance(6)
    reads = served.app.observed.queue_reads

    scrapes = [Scrape(text) for text in await asyncio.gather(*(served.text() for _ in range(8)))]

    assert served.app.observed.queue_reads == reads + 1  # eight scrapes at once, one query
    for scrape in scrapes:
        assert scrape("leasehold_queue_depth", kind="remote.queue") == 4
        assert scrape("leasehold_oldest_queued_seconds", kind="remote.queue") == 10.0

    await enqueue(served.stub, "remote.queue")
    served.clock.advance(QUEUE_READ_INTERVAL_SECONDS - 1)
    cached = await served.scrape()
    assert served.app.observed.queue_reads == reads + 1  # still within the interval
    assert cached("leasehold_queue_depth", kind="remote.queue") == 4
    # The age is counted from the cached oldest due time at every scrape.
    assert (
        cached("leasehold_oldest_queued_seconds", kind="remote.queue")
        == 10.0 + QUEUE_READ_INTERVAL_SECONDS - 1
    )

    served.clock.advance(1)
    fresh = await served.scrape()
    assert served.app.observed.queue_reads == reads + 2
    assert fresh("leasehold_queue_depth", kind="remote.queue") == 5

    claimed = [await served.claim("remote.queue") for _ in range(5)]
    served.clock.advance(QUEUE_READ_INTERVAL_SECONDS)
    drained = await served.scrape()
    assert len(claimed) == 5
    assert not drained.has("leasehold_queue_depth", kind="remote.queue")  # nothing due is waiting


def _in(clock: ManualClock, seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(clock.now() + timedelta(seconds=seconds))
    return stamp


# ----- the endpoint ------------------------------------------------------------------------------


async def test_each_app_counts_alone_and_stop_closes_the_endpoint(database_url: str, tmp_path: Path) -> None:
    """Two apps in one process: each has its own registry, so one's work never
    shows in the other's metrics; stop() closes the endpoint."""
    first = LeaseholdApp(settings_for(database_url), clock=ManualClock(), registry=test_registry())
    second = LeaseholdApp(
        settings_for(sqlite_url(tmp_path, "second.db")), clock=ManualClock(), registry=test_registry()
    )
    await first.start()
    try:
        await second.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{first.port}") as channel:
                await enqueue(jobs_pb2_grpc.JobServiceStub(channel), REMOTE)
            assert (await scrape_of(first))("leasehold_jobs_enqueued_total", kind=REMOTE) == 1
            assert (await scrape_of(second))("leasehold_jobs_enqueued_total", kind=REMOTE) == 0
        finally:
            await second.stop(grace_seconds=0.5)
        assert first.metrics_server is not None
        port = first.metrics_server.port
    finally:
        await first.stop(grace_seconds=0.5)
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")


async def scrape_of(app: LeaseholdApp) -> Scrape:
    assert app.metrics_server is not None
    return Scrape(await asyncio.to_thread(_get, f"http://127.0.0.1:{app.metrics_server.port}/metrics"))


async def test_without_the_flag_nothing_is_served_or_wrapped(database_url: str) -> None:
    settings = Settings(database_url=database_url, listen="127.0.0.1:0")
    app = LeaseholdApp(settings, registry=test_registry())
    await app.start()
    try:
        assert app.metrics is None and app.metrics_server is None and app.observed is None
    finally:
        await app.stop(grace_seconds=0.5)

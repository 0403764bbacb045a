"""`leasehold.client` against real `leasehold serve` processes: a watch that outlives
its server, paging, which failures are retried, an Enqueue that waits for a
server to come up without ever making two jobs, and numbers that come back as the
caller sent them."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from leasehold.client import Client, RetryOptions, Tls, enqueue_request, to_dict
from leasehold.v1 import jobs_pb2
from tests.credentials import Authority, token_file
from tests.postgres_cluster import free_port
from tests.support import OTHER_OWNER, OWNER, sqlite_url
from tests.system.helpers import TEST_HANDLERS, Leasehold, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LEASE = "6"  # the shortest lease: a killed server's job runs again soon after the restart
PATIENT = RetryOptions(deadline_seconds=40, max_backoff_seconds=0.5)
# One try per call: what bounds a call must not bound a watch that rides
# through a restart.
ONE_TRY = RetryOptions(deadline_seconds=0, max_backoff_seconds=0.5)


@dataclass(frozen=True)
class CountedRetry(RetryOptions):
    """RetryOptions that keep every backoff the client took: how many times a call
    was retried is counted, where timing it would only guess (a loaded machine
    stretches one try as much as several)."""

    slept: list[float] = field(default_factory=list)

    def backoffs(self) -> Iterator[float]:
        for backoff in super().backoffs():
            self.slept.append(backoff)
            yield backoff


def serve_on(database_url: str, port: int, *extra: str) -> Leasehold:
    return Leasehold("serve", "--database-url", database_url, "--listen", f"127.0.0.1:{port}", *extra)


async def watch_until_cut(
    client: Client, job_id: str, seen: list[jobs_pb2.JobEvent], cut: asyncio.Event, cut_after: int
) -> None:
    async for event in client.watch(job_id):
        seen.append(event)
        if event.sequence == cut_after:
            cut.set()


def assert_one_to_n(events: list[jobs_pb2.JobEvent]) -> None:
    assert [event.sequence for event in events] == list(range(1, len(events) + 1))


async def watch_across(
    database_url: str,
    processes: Callable[[Leasehold], Leasehold],
    stop: Callable[[Leasehold], None],
    *serve_flags: str,
    retry: RetryOptions = PATIENT,
    port: int | None = None,
) -> tuple[list[jobs_pb2.JobEvent], int]:
    """Watch a job while `stop` ends its server and a new one starts on the same
    file and port; returns what the watch saw and how much of it came before the stop."""
    port = port or free_port()
    first = processes(serve_on(database_url, port, "--lease-seconds", LEASE, *serve_flags))
    first.start()
    async with Client(f"127.0.0.1:{port}", owner=OWNER, retry=retry) as client:
        job = (await client.enqueue("example.sleep", {"seconds": 4, "steps": 8})).job
        seen: list[jobs_pb2.JobEvent] = []
        cut = asyncio.Event()
        watching = asyncio.create_task(watch_until_cut(client, job.id, seen, cut, cut_after=4))
        await asyncio.wait_for(cut.wait(), 30)
        await asyncio.to_thread(stop, first)
        before = len(seen)
        processes(serve_on(database_url, port, "--lease-seconds", LEASE)).start()
        await asyncio.wait_for(watching, 60)
    return seen, before


async def test_watch_survives_a_sigkilled_and_restarted_server(database_url: str, processes) -> None:
    seen, before = await watch_across(database_url, processes, lambda server: server.kill())
    assert 4 <= before < len(seen)  # the stream broke mid-job and went on afterwards
    assert_one_to_n(seen)
    assert seen[-1].type == "job.succeeded"
    assert [event.payload["attempt"] for event in seen if event.type == "job.started"] == [1, 2]


async def test_watch_survives_a_sigterm_drain(database_url: str, processes) -> None:
    def drain(server: Leasehold) -> None:
        server.interrupt(timeout=20, signum=signal.SIGTERM)

    seen, before = await watch_across(database_url, processes, drain, "--shutdown-grace", "0.2")
    assert 4 <= before < len(seen)
    assert_one_to_n(seen)
    assert seen[-1].type == "job.succeeded"
    assert "job.released" in [event.type for event in seen]


async def test_a_watch_rides_through_a_restart_past_the_call_deadline_and_says_so_once(
    database_url: str, processes, caplog: pytest.LogCaptureFixture
) -> None:
    """One server, stopped (SIGTERM: a drain) and started again on its port and
    file while a watch is open. The client's calls get one try each; the watch
    reconnects all the same, resumes after the last event it yielded, and logs
    one line for the break (not one per try)."""
    caplog.set_level(logging.INFO, logger="leasehold.client")
    port = free_port()

    def drain(server: Leasehold) -> None:
        server.interrupt(timeout=20, signum=signal.SIGTERM)

    seen, before = await watch_across(
        database_url, processes, drain, "--shutdown-grace", "0.2", retry=ONE_TRY, port=port
    )
    assert 4 <= before < len(seen)
    assert_one_to_n(seen)
    assert seen[-1].type == "job.succeeded"
    assert "job.released" in [event.type for event in seen]  # handed back, then run again
    notices = [record.getMessage() for record in caplog.records if record.name == "leasehold.client"]
    assert notices == [f"reconnected to 127.0.0.1:{port}, resuming after event {before}"]
    assert all(
        record.levelno == logging.INFO for record in caplog.records if record.name == "leasehold.client"
    )


async def test_a_watch_deadline_bounds_the_reconnecting(database_url: str, processes) -> None:
    port = free_port()
    server = processes(serve_on(database_url, port))
    server.start()
    async with Client(f"127.0.0.1:{port}", owner=OWNER, retry=PATIENT) as client:
        job = (await client.enqueue("example.sleep", {"seconds": 60, "steps": 60})).job
        seen: list[jobs_pb2.JobEvent] = []
        with pytest.raises(grpc.aio.AioRpcError) as gave_up:
            async for event in client.watch(job.id, deadline_seconds=0.5):
                seen.append(event)
                if event.type == "job.started":
                    await asyncio.to_thread(server.kill)  # and nothing comes back
    assert gave_up.value.code() == grpc.StatusCode.UNAVAILABLE
    assert [event.type for event in seen] == ["job.queued", "job.started"]


async def test_numbers_come_back_as_they_were_sent(database_url: str, processes) -> None:
    """Through a result, an event payload and the command line's JSON: integral
    numbers within +-2**53 as int, others as float, at any depth. A Struct is a
    double, so 2**53 + 1 has become 2**53 on the way (exact, hence an int), and
    2**53 + 2 is past the range in which a double stands for one integer: a float."""
    server = processes(Leasehold.serve(database_url, "--handlers", *TEST_HANDLERS))
    port = server.start()
    sent = {
        "width": 1024,
        "ratio": 1.5,
        "negative": -7,
        "nested": {"sizes": [1, 2.5, {"n": 3}], "flag": True},
        "past_exact": 2**53 + 1,
        "beyond": 2**53 + 2,
    }
    expected = {**sent, "past_exact": 2**53, "beyond": float(2**53 + 2)}
    async with Client(f"127.0.0.1:{port}", owner=OWNER) as client:
        job_id = (await client.enqueue("test.echo_result", sent)).job.id
        events = [event async for event in client.watch(job_id)]
        job = await client.get(job_id)
    result = to_dict(job.result)
    (echoed,) = [to_dict(event.payload) for event in events if event.type == "echo"]
    started = [to_dict(event.payload) for event in events if event.type == "job.started"]
    for got in (result, echoed):
        assert got == expected
        assert type(got["width"]) is int and type(got["ratio"]) is float
        assert type(got["nested"]["sizes"][0]) is int and type(got["nested"]["sizes"][2]["n"]) is int
        assert type(got["past_exact"]) is int and type(got["beyond"]) is float
    assert started == [{"attempt": 1}] and type(started[0]["attempt"]) is int

    env = {"LEASEHOLD_SERVER": f"127.0.0.1:{port}", "LEASEHOLD_OWNER": OWNER}
    shown = run_cli("jobs", "get", job_id, "--output", "json", env=env)
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout)["result"]
    assert printed == expected
    assert type(printed["width"]) is int and type(printed["past_exact"]) is int  # printed as 1024, not 1024.0


async def test_list_pages_through_1200_jobs(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url))
    async with Client(f"127.0.0.1:{server.start()}", owner=OWNER) as client:
        created: set[str] = set()
        for batch in range(3):
            requests = [
                jobs_pb2.EnqueueRequest(kind="example.echo", resource_type="n", resource_id=f"{batch}-{i}")
                for i in range(400)
            ]
            created |= {response.job.id for response in await client.batch_enqueue(requests)}
        listed = [job.id async for job in client.list(page_size=500)]
        first_page = await client.list_page(page_size=500)
    assert len(created) == 1200
    assert len(listed) == 1200 and set(listed) == created  # every page, nothing twice
    assert len(first_page.jobs) == 500 and first_page.next_page_token


async def test_a_graph_goes_in_one_batch_and_its_children_are_listed(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url))
    later = datetime.now(UTC) + timedelta(hours=1)
    async with Client(f"127.0.0.1:{server.start()}", owner=OWNER) as client:
        root = (await client.enqueue("example.echo", run_at=later)).job
        fetch, index, report = await client.batch_enqueue(
            [
                enqueue_request("example.echo", {"step": "fetch"}, depends_on=[root.id], ref="fetch"),
                enqueue_request(
                    "example.echo", depends_on_refs=["fetch"], ref="index", on_parent_failure="run"
                ),
                enqueue_request("example.echo", depends_on_refs=["fetch", "index"], depends_on=[root.id]),
            ]
        )
        after = await client.enqueue("example.echo", depends_on=[index.job.id], on_parent_failure="run")
        children = [job.id async for job in client.list(depends_on=fetch.job.id)]
        page = await client.list_page(depends_on=root.id, page_size=1)
        waiting = await client.get(report.job.id)
        with pytest.raises(ValueError, match="'cancel' or 'run'"):
            await client.enqueue("example.echo", depends_on=[root.id], on_parent_failure="never")  # type: ignore[arg-type]
    assert list(report.job.depends_on) == [root.id, fetch.job.id, index.job.id]
    assert index.job.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_RUN
    assert after.job.on_parent_failure == jobs_pb2.PARENT_FAILURE_POLICY_RUN
    assert list(after.job.depends_on) == [index.job.id] and after.job.pending_dependencies == 1
    assert children == [report.job.id, index.job.id]
    assert [job.id for job in page.jobs] == [report.job.id] and page.next_page_token
    assert waiting.wait_reason == jobs_pb2.WAIT_REASON_DEPENDENCIES and waiting.pending_dependencies == 3
    assert not waiting.HasField("available_at")


async def test_a_non_retryable_status_raises_at_once(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url))
    port = server.start()
    patient = CountedRetry(deadline_seconds=40, max_backoff_seconds=0.5)
    async with Client(f"127.0.0.1:{port}", owner=OWNER, retry=patient) as client:
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await client.enqueue("no.such.kind")
        with pytest.raises(grpc.aio.AioRpcError) as hidden:
            await client.get("job_0123")
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert hidden.value.code() in {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED}
    assert patient.slept == []  # one try each, not a 40 s deadline of them


async def test_counted_retry_sees_every_backoff() -> None:
    """The counter the tests above and below rely on does count: a read against
    nothing listening backs off at least once."""
    counted = CountedRetry(deadline_seconds=0.5, max_backoff_seconds=0.1)
    async with Client(f"127.0.0.1:{free_port()}", owner=OWNER, retry=counted) as client:
        with pytest.raises(grpc.aio.AioRpcError):
            await client.get("job_0123")
    assert counted.slept


async def test_retries_give_up_at_the_deadline(database_url: str) -> None:
    """With nothing listening, reads are retried until the deadline, then the
    UNAVAILABLE is raised: bounded, not forever, not at once."""
    options = CountedRetry(deadline_seconds=1.5, max_backoff_seconds=0.2)
    async with Client(f"127.0.0.1:{free_port()}", owner=OWNER, retry=options) as client:
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as down:
            await client.get("job_0123")
        took = time.monotonic() - began
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(options.slept) >= 2  # retried, not raised at once
    # Not before the deadline (a sleep only runs long), and no try started after it: the
    # last one ends within its attempt timeout. Either end fails a client that retries forever.
    assert took > 1.2, took
    assert took < options.deadline_seconds + options.attempt_timeout_seconds, took


async def test_an_enqueue_retried_until_the_server_is_up_makes_exactly_one_job(
    database_url: str, processes
) -> None:
    port = free_port()
    async with Client(f"127.0.0.1:{port}", owner=OWNER, retry=PATIENT) as client:
        enqueue = asyncio.create_task(client.enqueue("example.echo", {"n": 1}))
        await asyncio.sleep(1.0)  # several tries fail UNAVAILABLE meanwhile
        assert not enqueue.done()
        processes(serve_on(database_url, port)).start()
        response = await asyncio.wait_for(enqueue, 30)
        jobs = [job async for job in client.list()]
    assert response.created
    assert [job.id for job in jobs] == [response.job.id]


async def test_owner_credentials_scope_what_a_client_sees(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url))
    target = f"127.0.0.1:{server.start()}"
    async with Client(target, owner=OWNER) as alice:
        job = (await alice.enqueue("example.echo", {"n": 1})).job
        channel = grpc.aio.insecure_channel(target)
        bob = Client(target, owner=OTHER_OWNER, channel=channel)
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await bob.get(job.id)
        await bob.close()  # a shared channel stays open
        assert [j.id async for j in Client(target, owner=OWNER, channel=channel).list()] == [job.id]
        await channel.close()
    assert denied.value.code() in {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED}


async def test_tls_with_a_private_ca_a_client_certificate_and_a_token(
    tmp_path: Path, database_url: str, processes
) -> None:
    authority = Authority(tmp_path)
    server_cert = authority.server()
    tls_flags = ("--tls-cert", str(server_cert.cert_file), "--tls-key", str(server_cert.key_file))
    mtls = processes(
        Leasehold.serve(
            database_url, "--auth", "mtls", "--tls-client-ca", str(authority.cert_file), *tls_flags
        )
    )
    carol = authority.client("carol")
    with_cert = Tls(root_certificates=authority.cert, certificate_chain=carol.cert, private_key=carol.key)
    async with Client(f"127.0.0.1:{mtls.start()}", tls=with_cert) as client:
        job = (await client.enqueue("example.echo", {"n": 1})).job
        assert job.owner_id == "carol"  # the owner is the certificate's
    no_cert = Tls(root_certificates=authority.cert)
    quick = RetryOptions(deadline_seconds=0.5)  # a refused handshake reads UNAVAILABLE: do not wait it out
    async with Client(f"127.0.0.1:{mtls.port}", tls=no_cert, retry=quick) as anonymous:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await anonymous.get(job.id)
    assert refused.value.code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED}
    mtls.kill()

    path, (owner_token, admin_token) = token_file(tmp_path / "tokens", "owner:dave", "admin")
    tokens = processes(
        Leasehold.serve(
            sqlite_url(tmp_path, "tokens.db"), "--auth", "token", "--token-file", str(path), *tls_flags
        )
    )
    target = f"127.0.0.1:{tokens.start()}"
    roots = Tls(root_certificates=authority.cert)
    async with (
        Client(target, token=owner_token, tls=roots) as dave,
        Client(target, token=admin_token, tls=roots) as ops,
    ):
        mine = (
            await dave.enqueue("example.echo", {"n": 2}, run_at=datetime.now(UTC) + timedelta(days=1))
        ).job
        assert mine.owner_id == "dave"
        stats = await ops.admin.get_queue_stats()
        assert any(kind.kind == "example.echo" and kind.queued == 1 for kind in stats.kinds)
        own = await dave.stats()
        assert [(kind.kind, kind.counts.queued) for kind in own.kinds] == [("example.echo", 1)]
        assert own.total.queued == 1
        assert list((await ops.admin.workers()).workers) == []  # no remote worker has claimed
        assert [job.id async for job in ops.admin.list_all_jobs(owner_id="dave")] == [mine.id]
        assert await ops.admin.bulk_cancel(owner_id="dave", dry_run=True) == 1
        with pytest.raises(grpc.aio.AioRpcError) as not_admin:
            await dave.admin.get_queue_stats()
    assert not_admin.value.code() == grpc.StatusCode.PERMISSION_DENIED

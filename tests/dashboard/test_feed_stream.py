"""The overview's feed stream (`/feed/events`, server-sent events over
JobService.Subscribe) at the HTTP level, against a real `leasehold serve`:
a reconnect with the Last-Event-ID it was last sent goes on with the next
event, none missed and none twice; a Last-Event-ID that is no position is a
400, and one the service does not take starts the list over; the stream's
Subscribe ends when its reader goes away (the slot it held is free again),
and when its viewer's token is revoked; an open stream does not hold up the
drain."""

from __future__ import annotations

import http.client
import json
import signal
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.credentials import bearer, token_file
from tests.dashboard.test_serve import Browserless
from tests.support import owner_metadata, sqlite_url
from tests.system.helpers import Leasehold, wait_until

pytestmark = pytest.mark.slow

PARKED = "remote.parked"  # no worker claims it: one event per job (job.queued)
FEED = "/feed/events"


@dataclass
class Running:
    server: Leasehold
    web: Browserless
    jobs: jobs_pb2_grpc.JobServiceStub

    def enqueue(self, owner: str, kind: str = PARKED) -> str:
        request = jobs_pb2.EnqueueRequest(kind=kind)
        return str(self.jobs.Enqueue(request, metadata=owner_metadata(owner), timeout=15).job.id)

    def feed(self, owner: str, count: int) -> list[jobs_pb2.SubscribeResponse]:
        """The first `count` events of `owner`'s feed, from the oldest kept, read
        straight from Subscribe."""
        call = self.jobs.Subscribe(jobs_pb2.SubscribeRequest(), metadata=owner_metadata(owner), timeout=30)
        try:
            return [next(call) for _ in range(count)]
        finally:
            call.cancel()


@pytest.fixture
def start(tmp_path: Path, processes: Callable[[Leasehold], Leasehold]) -> Iterator[Callable[..., Running]]:
    channels: list[grpc.Channel] = []

    def started(*extra: str) -> Running:
        dashboard = ("--dashboard-listen", "127.0.0.1:0", "--remote-kinds", "remote.*")
        server = processes(Leasehold.serve(sqlite_url(tmp_path), *dashboard, *extra))
        port = server.start()
        web = Browserless(str(server.started.dashboard))
        assert web.sign_in("ann")[0] == 200
        channels.append(grpc.insecure_channel(f"127.0.0.1:{port}"))
        return Running(server, web, jobs_pb2_grpc.JobServiceStub(channels[-1]))

    yield started
    for channel in channels:
        channel.close()


def _open(web: Browserless, last_event_id: str | None = None) -> http.client.HTTPResponse:
    """The feed stream; each read waits at most the socket timeout (15 s)."""
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    response: http.client.HTTPResponse = web._opener.open(
        urllib.request.Request(web.base + FEED, headers=headers), timeout=15
    )
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    return response


def _messages(stream: http.client.HTTPResponse, count: int) -> list[dict[str, str]]:
    """The next `count` messages that carry an event (a bare `retry:` is none)."""
    messages: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    while len(messages) < count:
        line = stream.readline().decode()
        assert line, f"the stream ended after {messages}"
        if line == "\n":
            if "event" in fields:
                messages.append(fields)
            fields = {}
            continue
        name, _, value = line.rstrip("\n").partition(": ")
        fields[name] = value
    return messages


def test_a_reconnect_with_the_last_event_id_goes_on_with_the_next_event(
    start: Callable[..., Running],
) -> None:
    running = start()
    anns = []
    for _ in range(6):
        anns.append(running.enqueue("ann"))
        running.enqueue("bob")  # interleaved: never in ann's stream
    feed = running.feed("ann", 6)
    assert [response.event.job_id for response in feed] == anns
    positions = [response.position for response in feed]

    with _open(running.web, positions[0]) as first:
        received = _messages(first, 2)
    # The connection dropped; EventSource reconnects with the last id it was sent.
    with _open(running.web, received[-1]["id"]) as second:
        received += _messages(second, 3)

    assert [message["id"] for message in received] == positions[1:]
    assert [message["event"] for message in received] == ["feed"] * 5
    data = [json.loads(message["data"]) for message in received]
    assert [item["job_id"] for item in data] == anns[1:]
    assert [item["position"] for item in data] == positions[1:]
    assert {(item["type"], item["kind"], item["resource"]) for item in data} == {("job.queued", PARKED, "")}
    assert all(item["job_url"] == f"{running.web.base}/jobs/{item['job_id']}" for item in data)


@pytest.mark.parametrize("last_event_id", ["a b", "x" * 200, "caf\u00e9", "1;2"])
def test_a_last_event_id_that_is_no_position_is_a_400(
    start: Callable[..., Running], last_event_id: str
) -> None:
    running = start()
    request = urllib.request.Request(running.web.base + FEED, headers={"Last-Event-ID": last_event_id})
    with pytest.raises(urllib.error.HTTPError) as refused:
        running.web._opener.open(request, timeout=15)
    assert (refused.value.code, refused.value.read()) == (400, b"Last-Event-ID must be a feed position\n")


@pytest.mark.parametrize("last_event_id", ["ffffffffffffffff", "not-a-position"])
def test_a_position_the_service_refuses_starts_the_list_over(
    start: Callable[..., Running], last_event_id: str
) -> None:
    running = start()
    with _open(running.web, last_event_id) as stream:
        body = stream.read()  # the stream ends: the page opens a fresh one
    assert body == b'retry: 2000\n\nevent: restart\ndata: {"code": "INVALID_ARGUMENT"}\n\n'
    assert "Traceback" not in running.server.output


def test_a_closed_feed_ends_its_subscribe_call(start: Callable[..., Running]) -> None:
    # One stream per owner: while the feed's Subscribe holds ann's slot, her
    # WatchEvents is refused; once it has ended, it is served again.
    running = start("--max-watch-streams-per-owner", "1")
    job_id = running.enqueue("ann", "example.echo")
    running.enqueue("ann")

    def watch_refused() -> bool:
        request = jobs_pb2.WatchEventsRequest(job_id=job_id)
        try:
            events = list(running.jobs.WatchEvents(request, metadata=owner_metadata("ann"), timeout=15))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            return True
        assert events[-1].event.type == "job.succeeded"
        return False

    assert not watch_refused()  # ends at job.succeeded, freeing the slot
    first = running.feed("ann", 1)[0]  # its own Subscribe, cancelled: the slot is freed soon after

    def following() -> http.client.HTTPResponse | None:
        """The feed after `first`, once its Subscribe gets the slot: an event
        follows at once, or the refusal does."""
        stream = _open(running.web, first.position)
        if _messages(stream, 1)[0]["event"] == "feed":
            return stream
        stream.close()
        return None

    stream = wait_until(following, 15, "the feed's Subscribe to get ann's one stream")
    assert watch_refused()
    with _open(running.web) as second:  # the page in a second tab
        assert second.read() == b'retry: 2000\n\nevent: failure\ndata: {"code": "RESOURCE_EXHAUSTED"}\n\n'

    stream.close()  # the browser went away
    wait_until(lambda: not watch_refused(), 15, "the closed feed's Subscribe to end")


def test_an_open_feed_does_not_hold_up_the_drain(start: Callable[..., Running]) -> None:
    running = start()
    running.enqueue("ann")
    running.enqueue("ann")
    first, second = running.feed("ann", 2)
    stream = _open(running.web, first.position)
    assert _messages(stream, 1)[0]["id"] == second.position  # following the feed

    running.server.interrupt(signum=signal.SIGTERM)  # fails if the process does not exit
    assert running.server.returncode == 0
    rest = stream.read()  # the stream has ended: a drain is no failure, the page reconnects
    assert b"event: failure" not in rest
    stream.close()


def test_a_revoked_token_ends_the_feed(tmp_path: Path, processes: Callable[[Leasehold], Leasehold]) -> None:
    path, (ann,) = token_file(tmp_path / "tokens", "owner:ann")
    auth = ("--auth", "token", "--token-file", str(path))
    dashboard = ("--dashboard-listen", "127.0.0.1:0", "--remote-kinds", "remote.*")
    server = processes(Leasehold.serve(sqlite_url(tmp_path), *auth, *dashboard))
    port = server.start()
    web = Browserless(str(server.started.dashboard))
    assert web.sign_in(ann)[0] == 200
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        jobs = jobs_pb2_grpc.JobServiceStub(channel)
        for _ in range(2):
            jobs.Enqueue(jobs_pb2.EnqueueRequest(kind=PARKED), metadata=bearer(ann), timeout=15)
        call = jobs.Subscribe(jobs_pb2.SubscribeRequest(), metadata=bearer(ann), timeout=30)
        first, second = next(call), next(call)
        call.cancel()
    with _open(web, first.position) as stream:
        assert _messages(stream, 1)[0]["id"] == second.position  # following the feed, quiet now

        path.write_text("")  # ann's token revoked
        assert server.process is not None
        server.process.send_signal(signal.SIGHUP)

        rest = stream.read()  # to the end of the stream
    assert rest == b'event: failure\ndata: {"code": "UNAUTHENTICATED"}\n\n'
    assert ann not in server.output

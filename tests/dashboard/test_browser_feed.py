"""The owner overview's "Recent events" in a real headless Chromium, against a
real `leasehold serve --auth token --dashboard-listen`: a fresh page starts at
the end of the owner's feed and says events appear as they happen; then each
event of the owner's jobs appears as it commits, newest first, with its time,
type, kind, job link and resource (escaped), and never another owner's; the
list keeps the newest FEED_ROWS; an admin's overview has no feed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from leasehold._server.dashboard.routes_overview import FEED_ROWS
from tests.credentials import token_file
from tests.dashboard.browser import WAIT_SECONDS, Api, Page, chromium
from tests.support import sqlite_url
from tests.system.helpers import Leasehold, wait_until

pytestmark = pytest.mark.slow

# A remote kind no worker claims: each of its jobs has exactly one event (job.queued).
PARKED = "remote.parked"
ECHO = "example.echo"
SCRIPT = "<script>window.pwned = 1</script>"
IMG = '<img src=x onerror="window.pwned = 2">'
EMPTY = "Events of your jobs appear here as they happen, newest first."
# The rows as the page holds them, read in one go (rows come and go while a
# test reads them one by one).
ROWS_SCRIPT = """
return Array.from(document.querySelectorAll("#feed tr.feed-event")).map(function (row) {
  const text = function (name) { return row.querySelector("td." + name).textContent; };
  return {position: row.dataset.position, job: text("job"), href: row.querySelector("td.job a").href,
          at: text("at"), type: text("type"), kind: text("kind"), resource: text("resource")};
});
"""


@dataclass
class Service:
    url: str
    ann: Api
    bob: Api
    ann_token: str
    admin_token: str


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    directory = tmp_path_factory.mktemp("dashboard-feed")
    path, (ann, bob, admin) = token_file(directory / "tokens", "owner:ann", "owner:bob", "admin")
    server = Leasehold.serve(
        sqlite_url(directory),
        "--auth", "token", "--token-file", str(path),
        "--dashboard-listen", "127.0.0.1:0",
        "--remote-kinds", "remote.*",
        "--handlers", "leasehold.examples",
    )  # fmt: skip
    try:
        port = server.start()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Service(str(server.started.dashboard), Api(channel, ann), Api(channel, bob), ann, admin)
        server.interrupt()
        assert "Traceback" not in server.output
    finally:
        server.kill()


@pytest.fixture(scope="module")
def page(service: Service) -> Iterator[Page]:
    driver = chromium()
    try:
        yield Page(driver, service.url)
    finally:
        driver.quit()


def _rows(page: Page) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = page.driver.execute_script(ROWS_SCRIPT)
    return rows


def _open_feed(page: Page, service: Service) -> list[str]:
    """Sign in as ann and wait until her feed is followed: a fresh page starts
    at the feed's end, wherever that was when its Subscribe reached the
    service, so parked jobs are enqueued until one shows. Returns their ids."""
    page.sign_in(service.ann_token)
    page.wait(lambda: page.text("#feed-live") == "live", "the feed to connect")
    warm_ups: list[str] = []

    def one_shows() -> list[dict[str, str]]:
        warm_ups.append(service.ann.enqueue(PARKED).id)
        return _rows(page)

    shown = wait_until(one_shows, WAIT_SECONDS, "an event of ann's in the feed", interval=0.5)
    assert {row["job"] for row in shown} <= set(warm_ups)
    return warm_ups


def _shows(page: Page, job_id: str, event_type: str) -> bool:
    return any(row["job"] == job_id and row["type"] == event_type for row in _rows(page))


def test_a_fresh_overview_says_events_appear_here_and_shows_none_from_before(
    service: Service, page: Page
) -> None:
    before = service.ann.enqueue(PARKED).id  # in ann's feed before her page opens
    page.sign_in(service.ann_token)
    assert page.text("h2:last-of-type").startswith("Recent events")
    assert page.text("#feed-empty") == EMPTY
    page.wait(lambda: page.text("#feed-live") == "live", "the feed to connect")
    assert _rows(page) == [] and page.text("#feed-empty") == EMPTY

    warm_ups = _open_feed(page, service)
    assert page.driver.find_elements(By.ID, "feed-empty") == []
    assert before not in {row["job"] for row in _rows(page)}
    assert before not in warm_ups


def test_the_owners_events_appear_newest_first_and_never_another_owners(service: Service, page: Page) -> None:
    warm_ups = _open_feed(page, service)
    bobs = [service.bob.enqueue(PARKED, resource_type="order", resource_id="b-1").id]
    parked = service.ann.enqueue(PARKED, resource_type="order", resource_id=SCRIPT).id
    bobs.append(service.bob.enqueue(ECHO).id)
    echo = service.ann.enqueue(ECHO, {"n": 1}, resource_type="mail", resource_id=IMG).id
    # The feed is in commit order: once the echo job's last event shows, every
    # earlier one has.
    page.wait(lambda: _shows(page, echo, "job.succeeded"), "ann's echo job to succeed in the feed")

    rows = [row for row in _rows(page) if row["job"] not in warm_ups]
    assert [(row["job"], row["type"], row["kind"], row["resource"]) for row in rows] == [
        (echo, "job.succeeded", ECHO, f"mail/{IMG}"),
        (echo, "echo", ECHO, f"mail/{IMG}"),
        (echo, "job.started", ECHO, f"mail/{IMG}"),
        (echo, "job.queued", ECHO, f"mail/{IMG}"),
        (parked, "job.queued", PARKED, f"order/{SCRIPT}"),
    ]
    positions = [row["position"] for row in _rows(page)]
    assert positions == sorted(set(positions), reverse=True)  # newest first, each once
    for row in rows:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row["at"]), row
        assert row["href"] == f"{service.url.rstrip('/')}/jobs/{row['job']}"

    # Another owner's jobs are not in ann's feed, not even their ids.
    for job_id in bobs:
        assert job_id not in page.driver.page_source
    # Resources are text: no element was made of them, no script ran.
    assert page.driver.find_elements(By.CSS_SELECTOR, "#feed img, #feed script, #feed b") == []
    assert page.driver.execute_script("return window.pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        page.driver.switch_to.alert.text  # noqa: B018

    # A row links to its job's page.
    page.submit(f"#feed tr[data-position='{rows[0]['position']}'] td.job a")
    assert page.text("#job-id") == echo


def test_the_list_keeps_the_newest_rows(service: Service, page: Page) -> None:
    _open_feed(page, service)
    more = [service.ann.enqueue(PARKED).id for _ in range(FEED_ROWS + 5)]  # one event each
    page.wait(lambda: [row["job"] for row in _rows(page)][:1] == more[-1:], "the last job at the top")
    assert [row["job"] for row in _rows(page)] == more[::-1][:FEED_ROWS]


def test_an_admin_overview_has_no_feed(service: Service, page: Page) -> None:
    page.sign_in(service.admin_token)
    assert page.driver.find_elements(By.ID, "feed") == []
    page.open("/feed/events")
    assert page.text("#message") == "The feed of events is an owner's."

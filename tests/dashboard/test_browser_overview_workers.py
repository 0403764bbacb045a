"""The owner's overview and the admin's Workers page in a real headless
Chromium, against a real `leasehold serve --auth token --dashboard-listen`
with remote kinds: an owner with more jobs than a List page holds sees every
one counted (and no other owner's); an admin sees a real remote worker, the
one that holds a job through a raw WorkerService Claim; an owner is offered
no Workers page and shown no worker when asking for it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from selenium.webdriver.common.by import By

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.credentials import bearer, token_file
from tests.dashboard.browser import Page, chromium
from tests.support import sqlite_url
from tests.system.helpers import Leasehold, wait_until

pytestmark = pytest.mark.slow

# Remote kinds: no worker ever claims PARKED, so its jobs stay queued; the
# test's own Claim takes the one HELD job and keeps its lease.
PARKED = "remote.parked"
HELD = "remote.held"
WORKER_ID = "gpu-box-7"
# More than one List page (500) holds.
MANY = 600
BATCH = 300


@dataclass
class Service:
    url: str
    channel: grpc.Channel
    ann: str
    bob: str
    admin: str
    worker: str

    def enqueue_many(self, token: str, kind: str, count: int) -> None:
        stub = jobs_pb2_grpc.JobServiceStub(self.channel)
        for start in range(0, count, BATCH):
            requests = [jobs_pb2.EnqueueRequest(kind=kind) for _ in range(min(BATCH, count - start))]
            stub.BatchEnqueue(
                jobs_pb2.BatchEnqueueRequest(requests=requests), metadata=bearer(token), timeout=30
            )

    def enqueue(self, token: str, kind: str) -> jobs_pb2.Job:
        stub = jobs_pb2_grpc.JobServiceStub(self.channel)
        return stub.Enqueue(jobs_pb2.EnqueueRequest(kind=kind), metadata=bearer(token), timeout=10).job

    def get(self, token: str, job_id: str) -> jobs_pb2.Job:
        stub = jobs_pb2_grpc.JobServiceStub(self.channel)
        return stub.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=bearer(token), timeout=10).job


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    directory = tmp_path_factory.mktemp("dashboard-workers")
    path, (ann, bob, admin, worker) = token_file(
        directory / "tokens", "owner:ann", "owner:bob", "admin", "worker"
    )
    server = Leasehold.serve(
        sqlite_url(directory),
        "--auth", "token", "--token-file", str(path),
        "--dashboard-listen", "127.0.0.1:0",
        "--remote-kinds", "remote.*",
        "--handlers", "leasehold.examples",
        "--lease-seconds", "600",  # the test's Claim holds its job for the whole module
    )  # fmt: skip
    try:
        port = server.start()
        url = str(server.started.dashboard)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Service(url, channel, ann, bob, admin, worker)
        server.interrupt()
    finally:
        server.kill()


@pytest.fixture(scope="module")
def page(service: Service) -> Iterator[Page]:
    driver = chromium()
    try:
        yield Page(driver, service.url)
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def held(service: Service) -> jobs_pb2.Job:
    """Bob's HELD job, claimed by WORKER_ID with a raw Claim and held under its lease."""
    job = service.enqueue(service.bob, HELD)
    stub = worker_pb2_grpc.WorkerServiceStub(service.channel)
    request = worker_pb2.ClaimRequest(worker_id=WORKER_ID, kinds=[HELD], max_jobs=1, wait_seconds=10)
    claimed = stub.Claim(request, metadata=bearer(service.worker), timeout=30)
    assert [item.job.id for item in claimed.jobs] == [job.id]
    assert service.get(service.bob, job.id).status == jobs_pb2.JOB_STATUS_RUNNING
    return job


def _kind_row(page: Page, kind: str) -> dict[str, str]:
    row = page.driver.find_element(By.CSS_SELECTOR, f"#kinds tr[data-kind='{kind}']")
    return {
        status: str(row.find_element(By.CSS_SELECTOR, f"td.{status}").text)
        for status in ("queued", "running", "succeeded", "failed", "cancelled")
    }


def test_before_any_claim_the_workers_page_says_how_a_worker_appears(service: Service, page: Page) -> None:
    # First in this module, before the `held` fixture's Claim.
    page.sign_in(service.admin)
    page.open("/workers")
    assert page.text("h1") == "Remote workers"
    assert page.text("#no-workers").startswith("No remote worker has claimed or holds a job on this server")
    assert page.driver.find_elements(By.CSS_SELECTOR, "tr[data-worker-id]") == []


def test_an_owners_overview_counts_every_job_of_theirs_and_no_one_elses(
    service: Service, page: Page, held: jobs_pb2.Job
) -> None:
    service.enqueue_many(service.ann, PARKED, MANY)
    service.enqueue_many(service.bob, PARKED, 40)  # bob's: never ann's figures
    done = [service.enqueue(service.ann, "example.echo").id for _ in range(2)]
    for job_id in done:
        wait_until(
            lambda j=job_id: service.get(service.ann, j).status == jobs_pb2.JOB_STATUS_SUCCEEDED,
            20,
            "ann's echo jobs to succeed",
        )

    page.sign_in(service.ann)
    assert page.text("#who") == "Signed in as owner ann"
    totals = {status: page.text(f"#total-{status}") for status in ("queued", "running", "succeeded")}
    assert totals == {"queued": str(MANY), "running": "0", "succeeded": "2"}
    assert page.text("#total-failed") == page.text("#total-cancelled") == "0"
    assert _kind_row(page, PARKED) == {
        "queued": str(MANY), "running": "0", "succeeded": "0", "failed": "0", "cancelled": "0"
    }  # fmt: skip
    assert _kind_row(page, "example.echo")["succeeded"] == "2"
    rows = page.driver.find_elements(By.CSS_SELECTOR, "#kinds tr[data-kind]")
    assert HELD not in [row.get_attribute("data-kind") for row in rows]  # bob's running job is not ann's
    assert page.text("#counted").startswith("Every job of yours, counted")

    # The oldest queued job still comes from a List page, and says so.
    assert re.fullmatch(r"Job \S+ \(remote\.parked\), due (\d+ (s|min) ago|now)\.", page.text("#oldest"))
    assert page.text("#oldest-among") == "Looked for among your 500 newest queued jobs."

    page.sign_in(service.bob)
    assert page.text("#total-queued") == "40"
    assert page.text("#total-running") == "1"  # the job the remote worker holds


def _worker_rows(page: Page) -> dict[str, dict[str, str]]:
    rows = {}
    for row in page.driver.find_elements(By.CSS_SELECTOR, "#workers-table tr[data-worker-id]"):
        cells = {
            name: str(row.find_element(By.CSS_SELECTOR, f"td.{name}").text)
            for name in ("worker-id", "kinds", "jobs-held", "last-seen", "claiming")
        }
        rows[str(row.get_attribute("data-worker-id"))] = cells
    return rows


def test_an_admin_sees_the_remote_worker_that_holds_a_job(
    service: Service, page: Page, held: jobs_pb2.Job
) -> None:
    page.sign_in(service.admin)
    assert page.texts("#nav a") == ["Overview", "Jobs", "Workers"]
    page.submit("#nav a[href$='/workers']")
    assert page.text("h1") == "Remote workers"
    rows = _worker_rows(page)
    assert list(rows) == [WORKER_ID]  # the server's own runtime is not listed
    row = rows[WORKER_ID]
    assert (row["worker-id"], row["kinds"], row["jobs-held"], row["claiming"]) == (WORKER_ID, HELD, "1", "no")
    assert re.fullmatch(r"\d+ s ago|\d+ min ago|now", row["last-seen"]), row
    last_seen = page.driver.find_element(By.CSS_SELECTOR, f"tr[data-worker-id='{WORKER_ID}'] time")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", str(last_seen.get_attribute("title")))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", str(last_seen.get_attribute("datetime")))
    assert page.driver.find_elements(By.ID, "no-workers") == []
    assert page.driver.find_elements(By.ID, "workers-truncated") == []


def test_an_owner_is_offered_no_workers_page_and_shown_no_worker(
    service: Service, page: Page, held: jobs_pb2.Job
) -> None:
    page.sign_in(service.bob)  # the very owner whose job the worker holds
    assert page.texts("#nav a") == ["Overview", "Jobs", "Schedules"]
    page.open("/workers")
    assert page.text("h1") == "Workers are an admin's"
    assert "admin" in page.text("#message")
    assert page.driver.find_elements(By.ID, "workers-table") == []
    assert WORKER_ID not in page.driver.page_source
    page.open("/overview")  # still signed in: the refusal did not end the session
    assert page.text("#who") == "Signed in as owner bob"

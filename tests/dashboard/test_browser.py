"""The dashboard in a real headless Chromium, against a real `leasehold serve
--auth token --dashboard-listen` process: sign-in and who it names, the
overview against the API's own figures, the jobs table's filters, a job's
progress bar moving live, cancel, the buttons a status allows, times relative
to now, an owner's schedules, the isolation between owners, escaping, and
CSRF."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from leasehold.v1 import jobs_pb2
from tests.credentials import token_file
from tests.dashboard.browser import Api, Page, chromium, post
from tests.dashboard.handlers import GATE_DIR_ENV, gate_file
from tests.support import sqlite_url
from tests.system.helpers import Leasehold, wait_until

pytestmark = pytest.mark.slow

SCRIPT = "<script>window.pwned = 1</script>"
IMG = '<img src=x onerror="window.pwned = 2">'


@dataclass
class Service:
    url: str
    gates: Path
    owner_a: str
    owner_b: str
    owner_c: str
    admin: str
    a: Api
    b: Api
    c: Api
    root: Api

    def open_gate(self, job_id: str, step: int) -> None:
        gate_file(self.gates, job_id, step).touch()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    directory = tmp_path_factory.mktemp("dashboard")
    gates = directory / "gates"
    gates.mkdir()
    path, (owner_a, owner_b, owner_c, admin) = token_file(
        directory / "tokens", "owner:ann", "owner:bob", "owner:cy", "admin"
    )
    server = Leasehold.serve(
        sqlite_url(directory),
        "--auth", "token", "--token-file", str(path),
        "--dashboard-listen", "127.0.0.1:0",
        "--handlers", "leasehold.examples", "tests.dashboard.handlers",
        env={GATE_DIR_ENV: str(gates)},
    )  # fmt: skip
    try:
        port = server.start()
        url = str(server.started.dashboard)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Service(
                url,
                gates,
                owner_a,
                owner_b,
                owner_c,
                admin,
                Api(channel, owner_a),
                Api(channel, owner_b),
                Api(channel, owner_c),
                Api(channel, admin),
            )
        server.interrupt()
        for token in (owner_a, owner_b, owner_c, admin):
            assert token not in server.output  # no credential reaches a log
    finally:
        server.kill()


@pytest.fixture(scope="module")
def page(service: Service) -> Iterator[Page]:
    driver = chromium()
    try:
        yield Page(driver, service.url)
    finally:
        driver.quit()


def _no_script_ran(page: Page) -> None:
    assert page.driver.execute_script("return window.pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        page.driver.switch_to.alert.text  # noqa: B018


def test_sign_in_refuses_a_bad_token_and_keeps_the_token_out_of_the_page(
    service: Service, page: Page
) -> None:
    page.sign_in("lh_not-a-token-at-all")
    assert "not accepted" in page.text("#error")
    assert page.driver.get_cookie("leasehold_session") is None

    page.sign_in(service.owner_a)
    assert page.text("#who") == "Signed in as owner ann"  # who the token stands for, never the token
    cookie = page.driver.get_cookie("leasehold_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert service.owner_a not in page.driver.page_source
    assert service.owner_a not in cookie["value"]


def test_the_overview_counts_match_get_queue_stats(service: Service, page: Page) -> None:
    # Figures that stay put: jobs not yet due, and jobs that have finished.
    future = {"seconds": int(time.time()) + 3600}
    for _ in range(3):
        service.a.enqueue("example.sleep", run_at=future)
    service.b.enqueue("example.sleep", run_at=future)
    done = [service.a.enqueue("example.echo", {"n": n}).id for n in range(2)]
    failed = service.b.enqueue("example.fail", {"message": "no"}, max_attempts=1).id
    for job_id, api in [(done[0], service.a), (done[1], service.a), (failed, service.b)]:
        wait_until(lambda j=job_id, a=api: a.get(j).completed_at.seconds, 20, "jobs to finish")

    page.sign_in(service.admin)
    assert page.text("#who") == "Signed in as admin"
    stats = service.root.stats()
    rows = {
        row.get_attribute("data-kind"): row
        for row in page.driver.find_elements(By.CSS_SELECTOR, "#kinds tbody tr")
    }
    assert set(rows) == {kind.kind for kind in stats.kinds}
    for kind in stats.kinds:
        row = rows[kind.kind]
        shown = [row.find_element(By.CSS_SELECTOR, f"td.{name}").text for name in
                 ("queued", "running", "succeeded", "failed", "cancelled")]  # fmt: skip
        expected = [kind.queued, kind.running, kind.succeeded_last_hour, kind.failed_last_hour,
                    kind.cancelled_last_hour]  # fmt: skip
        assert shown == [str(count) for count in expected], kind.kind
    assert page.text("#total-queued") == str(sum(kind.queued for kind in stats.kinds)) == "4"
    assert page.text("#total-succeeded") == "2"
    assert page.text("#total-failed") == "1"
    assert stats.oldest_queued_job_id == ""  # every queued job is due in an hour
    assert page.text("#oldest") == "No queued job is due."
    # The chart: one bar group per minute of the last hour.
    assert len(page.driver.find_elements(By.CSS_SELECTOR, ".chart svg g")) == len(stats.finished_per_minute)
    page.screenshot("overview")


def test_filter_the_jobs_table(service: Service, page: Page) -> None:
    page.sign_in(service.owner_a)
    page.open("/jobs")
    assert set(page.texts("#jobs-table td.kind")) == {"example.sleep", "example.echo"}

    page.driver.find_element(By.ID, "kind").send_keys("example.echo")
    page.submit("#apply-filters")
    assert "kind=example.echo" in page.driver.current_url
    assert page.texts("#jobs-table td.kind") == ["example.echo", "example.echo"]
    assert page.texts("#jobs-table td.status") == ["succeeded", "succeeded"]

    page.open("/jobs?status=queued")
    assert page.texts("#jobs-table td.kind") == ["example.sleep"] * 3

    # An admin sees every owner's jobs, and can narrow them to one owner.
    page.sign_in(service.admin)
    page.open("/jobs")
    assert {"ann", "bob"} <= set(page.texts("#jobs-table td.owner"))
    page.screenshot("jobs")
    page.open("/jobs?owner=bob")
    assert set(page.texts("#jobs-table td.owner")) == {"bob"}


def test_a_running_jobs_progress_bar_moves_live_and_cancel_shows_cancelled(
    service: Service, page: Page
) -> None:
    job = service.a.enqueue("test.steps", {"steps": 4})
    wait_until(lambda: service.a.get(job.id).status == jobs_pb2.JOB_STATUS_RUNNING, 20, "the job to run")
    page.sign_in(service.owner_a)
    page.open(f"/jobs/{job.id}")
    assert page.text("#status") == "running"
    page.driver.execute_script("window.notReloaded = true")

    def progress() -> tuple[str, str]:
        element = page.driver.find_element(By.ID, "progress")
        return str(element.get_attribute("value")), str(element.get_attribute("max"))

    for step in (1, 2):
        service.open_gate(job.id, step)
        page.wait(lambda s=step: progress() == (str(s), "4"), f"the bar at step {step}")
    assert page.text("#progress-text") == "2 of 4"
    assert page.driver.execute_script("return window.notReloaded === true")
    page.screenshot("job")

    page.submit("#cancel")
    page.wait(lambda: page.text("#status") == "cancelled", "the status to read cancelled")
    assert service.a.get(job.id).status == jobs_pb2.JOB_STATUS_CANCELLED
    page.wait(lambda: "job.cancelled" in page.texts("#events tr.event td:nth-child(2)"), "the event")


def test_another_owner_cannot_see_or_act_on_a_job(service: Service, page: Page) -> None:
    anns = service.a.enqueue("test.steps", {"steps": 2})
    bobs = service.b.enqueue("example.echo", {"mine": True})
    # Pages that offer Cancel (a queued job) and Retry (a failed one).
    bobs_queued = service.b.enqueue("example.sleep", run_at={"seconds": int(time.time()) + 3600})
    bobs_failed = service.b.enqueue("example.fail", {"message": "no"}, max_attempts=1)
    wait_until(lambda: service.a.get(anns.id).status == jobs_pb2.JOB_STATUS_RUNNING, 20, "ann's job to run")
    wait_until(lambda: service.b.get(bobs_failed.id).completed_at.seconds, 20, "bob's job to fail")
    page.sign_in(service.owner_b)

    for path in (f"/jobs/{anns.id}", f"/jobs/{anns.id}/events"):
        page.open(path)
        assert page.text("#message") == "Job not found or not accessible.", path
    page.open("/jobs?owner=ann")  # an owner filter is not an owner's to set
    listed = [
        row.get_attribute("data-job-id")
        for row in page.driver.find_elements(By.CSS_SELECTOR, "tr[data-job-id]")
    ]
    assert bobs.id in listed and anns.id not in listed

    # Bob's own job pages, with the hidden job id edited to ann's.
    for button, bobs_page in (("#cancel", bobs_queued.id), ("#retry", bobs_failed.id)):
        page.open(f"/jobs/{bobs_page}")
        page.driver.execute_script(
            "document.querySelectorAll('input[name=job_id]').forEach(i => { i.value = arguments[0]; })",
            anns.id,
        )
        page.submit(button)
        assert page.text("#message") == "Job not found or not accessible.", button
    page.open(f"/jobs/{bobs_queued.id}")
    page.submit("#cancel")  # his own, so that later counts of his queued jobs stay as they were
    assert service.b.get(bobs_queued.id).status == jobs_pb2.JOB_STATUS_CANCELLED
    assert service.a.get(anns.id).status == jobs_pb2.JOB_STATUS_RUNNING
    assert not service.a.get(anns.id).HasField("cancel_requested_at")
    service.open_gate(anns.id, 1)
    service.open_gate(anns.id, 2)


def test_values_from_a_job_are_shown_as_text(service: Service, page: Page) -> None:
    echoed = service.a.enqueue("example.echo", {"note": IMG}, resource_type="t", resource_id=SCRIPT)
    failed = service.a.enqueue("example.fail", {"message": SCRIPT + IMG}, max_attempts=1)
    for job_id in (echoed.id, failed.id):
        wait_until(lambda j=job_id: service.a.get(j).completed_at.seconds, 20, "the jobs to finish")
    page.sign_in(service.owner_a)

    page.open("/jobs")
    row = page.driver.find_element(By.CSS_SELECTOR, f"tr[data-job-id='{echoed.id}'] td.resource")
    assert row.text == f"t/{SCRIPT}"
    failed_row = page.driver.find_element(By.CSS_SELECTOR, f"tr[data-job-id='{failed.id}'] td.error")
    assert failed_row.text == SCRIPT + IMG
    _no_script_ran(page)

    page.open(f"/jobs/{echoed.id}")
    assert page.text("#resource") == f"t/{SCRIPT}"
    shown = json.dumps({"note": IMG}, separators=(",", ":"))  # as JSON.stringify writes it
    page.wait(lambda: shown in page.texts("#events tr.event td:nth-child(4)"), "the echo event")
    page.open(f"/jobs/{failed.id}")
    assert page.text("#error") == f"RuntimeError: {SCRIPT}{IMG}"
    _no_script_ran(page)
    # The only scripts are the page's own; no image was made from a payload.
    sources = [s.get_attribute("src") for s in page.driver.find_elements(By.TAG_NAME, "script")]
    assert sources == [f"{service.url.rstrip('/')}/static/dashboard.js"]
    assert page.driver.find_elements(By.TAG_NAME, "img") == []


def test_a_post_without_this_sessions_csrf_token_is_refused(service: Service, page: Page) -> None:
    job = service.a.enqueue("example.sleep", run_at={"seconds": int(time.time()) + 3600})
    page.sign_in(service.owner_a)
    page.open(f"/jobs/{job.id}")
    page.driver.execute_script("document.querySelectorAll('input[name=csrf_token]').forEach(i => i.remove())")
    page.submit("#cancel")
    assert page.text("#message") == "The form's CSRF token is missing or not this session's."

    session = {"leasehold_session": page.cookie("leasehold_session")}
    cancel = f"{service.url.rstrip('/')}/jobs/cancel"
    assert post(cancel, {"job_id": job.id}, session)[0] == 403
    # A token from another session is no better.
    page.sign_in(service.owner_b)
    page.open("/jobs")
    bobs_token = page.driver.find_element(By.CSS_SELECTOR, "input[name=csrf_token]").get_attribute("value")
    assert post(cancel, {"job_id": job.id, "csrf_token": str(bobs_token)}, session)[0] == 403
    assert service.a.get(job.id).status == jobs_pb2.JOB_STATUS_QUEUED


def test_an_admin_counts_before_a_bulk_cancel_and_pauses_a_kind(service: Service, page: Page) -> None:
    future = {"seconds": int(time.time()) + 3600}
    parked = [service.b.enqueue("example.sleep", {"n": n}, run_at=future).id for n in range(3)]
    page.sign_in(service.admin)
    page.open("/jobs?status=queued&owner=bob")
    before = {kind.kind: kind.queued for kind in service.root.stats().kinds}
    page.submit("#bulk-cancel")
    assert page.text("#matched").startswith("4 jobs match")  # bob's 3 new ones and his earlier one
    assert [service.b.get(job_id).status for job_id in parked] == [jobs_pb2.JOB_STATUS_QUEUED] * 3
    page.submit("#confirm")
    assert page.text("#message") == "4 jobs cancelled."
    assert [service.b.get(job_id).status for job_id in parked] == [jobs_pb2.JOB_STATUS_CANCELLED] * 3
    wait_until(  # the service's stats may be a second old
        lambda: _queued(service, "example.sleep") == before["example.sleep"] - 4, 10, "the stats to follow"
    )

    page.open("/overview")
    page.submit("tr[data-kind='example.sleep'] button")
    assert page.text("#message") == "Claims of example.sleep are paused: its queued jobs wait."
    wait_until(lambda: _paused(service, "example.sleep"), 10, "the stats to say paused")
    page.open("/overview")
    assert page.text("tr[data-kind='example.sleep'] .paused") == "paused"
    page.submit("tr[data-kind='example.sleep'] button")
    assert page.text("#message") == "Claims of example.sleep go on."
    wait_until(lambda: not _paused(service, "example.sleep"), 10, "the stats to say resumed")


def _queued(service: Service, kind: str) -> int:
    return {stats.kind: stats.queued for stats in service.root.stats().kinds}[kind]


def _paused(service: Service, kind: str) -> bool:
    return {stats.kind: stats.paused for stats in service.root.stats().kinds}[kind]


def test_the_jobs_table_pages_through_every_job_once(service: Service, page: Page) -> None:
    future = {"seconds": int(time.time()) + 3600}
    new = {service.b.enqueue("example.sleep", {"n": n}, run_at=future).id for n in range(60)}
    page.sign_in(service.owner_b)
    page.open("/jobs")

    def shown() -> list[str]:
        rows = page.driver.find_elements(By.CSS_SELECTOR, "tr[data-job-id]")
        return [str(row.get_attribute("data-job-id")) for row in rows]

    first = shown()
    assert len(first) == 50 and set(first) <= new  # newest first: all of them from the 60 new
    page.submit("#next-page")
    second = shown()
    assert second and not set(first) & set(second)
    assert new <= set(first) | set(second)
    assert page.driver.find_elements(By.ID, "next-page") == []  # the last page
    page.submit("#first-page")
    assert shown() == first


def _offered(page: Page) -> list[str]:
    """The job actions the page shows, by button id."""
    return [
        str(button.get_attribute("id"))
        for button in page.driver.find_elements(By.CSS_SELECTOR, ".actions button")
    ]


def test_a_job_page_offers_only_the_actions_its_status_allows(service: Service, page: Page) -> None:
    running = service.c.enqueue("test.steps", {"steps": 1})
    failed = service.c.enqueue("example.fail", {"message": "no"}, max_attempts=1)
    done = service.c.enqueue("example.echo", {})
    wait_until(lambda: service.c.get(running.id).status == jobs_pb2.JOB_STATUS_RUNNING, 20, "the job to run")
    for job_id in (failed.id, done.id):
        wait_until(lambda j=job_id: service.c.get(j).completed_at.seconds, 20, "the jobs to finish")
    page.sign_in(service.owner_c)

    page.open(f"/jobs/{running.id}")
    assert page.text("#status") == "running"
    assert _offered(page) == ["cancel"]
    page.open(f"/jobs/{failed.id}")
    assert page.text("#status") == "failed"
    assert _offered(page) == ["retry"]
    page.open(f"/jobs/{done.id}")
    assert _offered(page) == []

    # A refused action (the cancel form pointed at Retry, as a stale page
    # might send it) leads back to the job it came from.
    page.open(f"/jobs/{running.id}")
    retry_url = f"{service.url.rstrip('/')}/jobs/retry"
    page.driver.execute_script(
        "document.querySelector('form[data-action=cancel]').action = arguments[0]", retry_url
    )
    page.submit("#cancel")
    assert page.text("h1") == "Not possible now"
    assert "only failed or cancelled jobs can be retried" in page.text("#message")
    page.submit("#back")
    assert page.text("#job-id") == running.id
    assert service.c.get(running.id).status == jobs_pb2.JOB_STATUS_RUNNING

    # When the job finishes, the live status drops the button it no longer allows.
    service.open_gate(running.id, 1)
    page.wait(lambda: page.text("#status") == "succeeded", "the status to read succeeded")
    page.wait(lambda: _offered(page) == [], "the cancel button to go")


def test_a_job_due_in_an_hour_reads_due_in_and_never_due_since(service: Service, page: Page) -> None:
    due_at = int(time.time()) + 3600
    job = service.c.enqueue("example.sleep", run_at={"seconds": due_at})
    page.sign_in(service.owner_c)
    page.open("/overview")
    assert page.text("#who") == "Signed in as owner cy"
    oldest = page.text("#oldest")
    assert job.id in oldest
    assert re.search(r"due in 5[89] min\.$", oldest), oldest
    assert "since" not in oldest
    expected_utc = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(due_at))
    shown = page.driver.find_element(By.ID, "oldest-due")
    assert shown.get_attribute("title") == expected_utc
    assert shown.get_attribute("datetime") == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(due_at))

    page.open(f"/jobs/{job.id}")
    assert re.fullmatch(r"due in 5[89] min", page.text("#due")), page.text("#due")
    assert re.fullmatch(r"\d+ s ago|now", page.text("#created")), page.text("#created")


def _schedule_rows(page: Page) -> dict[str, dict[str, str]]:
    rows = {}
    for row in page.driver.find_elements(By.CSS_SELECTOR, "#schedules-table tr[data-schedule-id]"):
        cells = {name: str(row.find_element(By.CSS_SELECTOR, f"td.{name}").text) for name in
                 ("state", "next-fire", "last-fire", "last-job")}  # fmt: skip
        rows[str(row.get_attribute("data-schedule-id"))] = cells
    return rows


def test_an_owner_pauses_resumes_and_triggers_their_own_schedules_only(service: Service, page: Page) -> None:
    yearly = "0 0 1 1 *"
    for schedule_id in ("ann-yearly", "ann-report"):
        service.a.create_schedule(schedule_id, yearly, "example.echo")
    bobs = ["bob-private-1", "bob-private-2"]
    for schedule_id in bobs:
        service.b.create_schedule(schedule_id, yearly, "example.echo")

    page.sign_in(service.owner_a)
    assert page.texts("#nav a") == ["Overview", "Jobs", "Schedules"]
    page.submit("#nav a[href$='/schedules']")
    rows = _schedule_rows(page)
    assert set(rows) == {"ann-yearly", "ann-report"}
    assert rows["ann-yearly"]["state"] == "active"
    assert re.fullmatch(r"in \d+ d", rows["ann-yearly"]["next-fire"]), rows["ann-yearly"]
    assert rows["ann-yearly"]["last-fire"] == rows["ann-yearly"]["last-job"] == "—"
    for schedule_id in bobs:
        assert schedule_id not in page.driver.page_source

    page.submit("tr[data-schedule-id='ann-yearly'] button.pause")
    assert _schedule_rows(page)["ann-yearly"]["state"] == "paused"
    assert _schedule_rows(page)["ann-yearly"]["next-fire"] == "—"
    assert service.a.schedule("ann-yearly").paused
    assert _schedule_rows(page)["ann-report"]["state"] == "active"

    page.submit("tr[data-schedule-id='ann-yearly'] button.resume")
    assert _schedule_rows(page)["ann-yearly"]["state"] == "active"
    assert not service.a.schedule("ann-yearly").paused

    page.submit("tr[data-schedule-id='ann-yearly'] button.trigger")
    assert page.text("h1") == "Triggered"
    made = service.a.schedule("ann-yearly").last_job_id
    assert made and page.text("#message-link") == f"Open job {made}"
    page.submit("#message-link")
    assert page.text("#job-id") == made
    assert page.text("#kind") == "example.echo"
    page.open("/schedules")
    row = _schedule_rows(page)["ann-yearly"]
    assert row["last-job"] == made
    assert re.fullmatch(r"\d+ s ago|now", row["last-fire"]), row

    # Bob's schedule id in ann's form: the API's "not found", nothing paused.
    page.driver.execute_script(
        "document.querySelectorAll('input[name=schedule_id]').forEach(i => { i.value = arguments[0]; })",
        bobs[0],
    )
    page.submit("tr[data-schedule-id='ann-report'] button.pause")
    assert page.text("#message") == "Schedule not found or not accessible."
    assert not service.b.schedule(bobs[0]).paused


def test_an_admin_is_not_sent_to_schedules_an_admin_credential_cannot_read(
    service: Service, page: Page
) -> None:
    page.sign_in(service.admin)
    assert page.texts("#nav a") == ["Overview", "Jobs", "Workers"]
    page.open("/schedules")
    assert page.text("h1") == "Schedules are an owner's"
    page.open("/overview")  # still signed in: the page asked ScheduleService nothing
    assert page.text("#who") == "Signed in as admin"


def _relatives(page: Page, table: str) -> list[tuple[str, str]]:
    """(job id, status) of each row of the job page's #parents or #children."""
    return [
        (str(row.get_attribute("data-job-id")), str(row.find_element(By.CSS_SELECTOR, "td.status").text))
        for row in page.driver.find_elements(By.CSS_SELECTOR, f"{table} tbody tr")
    ]


def test_a_job_page_lists_its_parents_and_children_with_their_statuses(service: Service, page: Page) -> None:
    first = service.a.enqueue("test.steps", {"steps": 1})
    second = service.a.enqueue("test.steps", {"steps": 1})
    for parent in (first, second):
        wait_until(
            lambda p=parent: service.a.get(p.id).status == jobs_pb2.JOB_STATUS_RUNNING, 20, "a parent to run"
        )
    child = service.a.enqueue("example.echo", {"after": "both"}, depends_on=[first.id, second.id])
    page.sign_in(service.owner_a)

    page.open(f"/jobs/{child.id}")
    assert page.text("#status") == "queued"
    assert page.text("#waiting") == "waiting for 2 parents"
    assert page.driver.find_elements(By.ID, "due") == []  # no due time while parents run
    assert _relatives(page, "#parents") == [(first.id, "running"), (second.id, "running")]
    assert "a parent that fails or is cancelled cancels it" in page.text("#parent-rule")
    assert page.driver.find_elements(By.ID, "children") == []
    page.submit(f"#parents tr[data-job-id='{first.id}'] a")
    assert page.text("#job-id") == first.id
    assert _relatives(page, "#children") == [(child.id, "queued")]
    assert page.driver.find_elements(By.ID, "parents") == []
    assert page.driver.find_elements(By.ID, "waiting") == []  # running: waiting for nothing

    service.open_gate(first.id, 1)
    wait_until(lambda: service.a.get(first.id).status == jobs_pb2.JOB_STATUS_SUCCEEDED, 20, "a parent to end")
    page.open(f"/jobs?parent={first.id}")  # every child, in the jobs table
    assert first.id in page.text("#parent-filter")
    listed = [
        row.get_attribute("data-job-id")
        for row in page.driver.find_elements(By.CSS_SELECTOR, "tr[data-job-id]")
    ]
    assert listed == [child.id]
    page.submit(f"tr[data-job-id='{child.id}'] a")
    assert page.text("#waiting") == "waiting for 1 parent"
    assert _relatives(page, "#parents") == [(first.id, "succeeded"), (second.id, "running")]

    # The last parent ends: the child runs, and its live page follows.
    service.open_gate(second.id, 1)
    page.wait(lambda: page.text("#status") == "succeeded", "the child to succeed")
    assert page.text("#waiting") == "—"
    page.wait(lambda: "job.dependencies_met" in page.texts("#events tr.event td:nth-child(2)"), "the event")

    # A parent filter is text, whatever it holds (a "/" leaves it unlinked).
    page.open(f"/jobs?parent={urllib.parse.quote(SCRIPT, safe='')}")
    _no_script_ran(page)

"""The browser tests' harness: Debian's chromium, headless, driven by selenium
through the system's chromedriver (given by path, so selenium downloads
nothing), and a small synchronous API client to set up and check jobs."""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import struct_pb2
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.ui import WebDriverWait

from leasehold.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc, schedules_pb2, schedules_pb2_grpc
from tests.credentials import bearer
from tests.support import require

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS_ENV = "LEASEHOLD_SCREENSHOTS_DIR"
WAIT_SECONDS = 15


def chromium() -> WebDriver:
    """A headless Chromium; skips loudly (fails in CI) when it is missing."""
    present = all(shutil.which(path) for path in (CHROMIUM, CHROMEDRIVER))
    require(present, f"{CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,1000")
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


class Page:
    """One browser on the dashboard at `base`."""

    def __init__(self, driver: WebDriver, base: str) -> None:
        self.driver = driver
        self.base = base.rstrip("/")

    def open(self, path: str) -> None:
        """Load `path` and wait until it is the document shown (a navigation a
        click started may still be landing when get() is called)."""
        self.driver.get(self.base + path)
        self.wait(lambda: self._location() == path and self._loaded(), f"{path} to load")

    def _location(self) -> str:
        return str(self.driver.execute_script("return location.pathname + location.search"))

    def _loaded(self) -> bool:
        return bool(self.driver.execute_script("return document.readyState") == "complete")

    def text(self, selector: str) -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, selector).text)

    def texts(self, selector: str) -> list[str]:
        return [str(element.text) for element in self.driver.find_elements(By.CSS_SELECTOR, selector)]

    def click(self, selector: str) -> None:
        self.driver.find_element(By.CSS_SELECTOR, selector).click()

    def submit(self, selector: str) -> None:
        """Click a button that loads a new page, and wait until it has."""
        old = self.driver.find_element(By.TAG_NAME, "html")
        self.click(selector)
        self.wait(lambda: self._replaced(old), f"the page after {selector}")
        self.wait(self._loaded, "the page to load")

    def _replaced(self, element: WebElement) -> bool:
        try:
            return bool(staleness_of(element)(self.driver))
        except WebDriverException as exc:
            # Asked about an element while its page is being replaced, Chromium can
            # answer this rather than with a stale-element error: it is gone too.
            if "does not belong to the document" in str(exc):
                return True
            raise

    def wait(self, condition: Callable[[], Any], what: str) -> Any:
        return WebDriverWait(self.driver, WAIT_SECONDS).until(lambda _: condition(), message=what)

    def sign_in(self, secret: str) -> None:
        self.driver.delete_all_cookies()
        self.open("/signin")
        self.driver.find_element(By.ID, "secret").send_keys(secret)
        self.submit("#sign-in")
        self.wait(
            lambda: self._location() in ("/overview", "/signin") and self._loaded(), "the sign-in's answer"
        )

    def cookie(self, name: str) -> str:
        found = self.driver.get_cookie(name)
        assert found is not None, f"no {name} cookie"
        return str(found["value"])

    def screenshot(self, name: str) -> None:
        """docs/images/dashboard-NAME.png, only when LEASEHOLD_SCREENSHOTS_DIR is set."""
        directory = os.environ.get(SCREENSHOTS_ENV)
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(Path(directory) / f"dashboard-{name}.png"))


def post(url: str, fields: dict[str, str], cookies: dict[str, str]) -> tuple[int, str]:
    """A form POST outside the browser (as a forged request would be sent)."""
    request = urllib.request.Request(
        url,
        data=urllib.parse.urlencode(fields).encode(),
        headers={"Cookie": "; ".join(f"{name}={value}" for name, value in cookies.items())},
        method="POST",
    )
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


class Api:
    """The gRPC API as a test sees it, with one credential."""

    def __init__(self, channel: grpc.Channel, token: str) -> None:
        self._jobs = jobs_pb2_grpc.JobServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)
        self._schedules = schedules_pb2_grpc.ScheduleServiceStub(channel)
        self._metadata = bearer(token)

    def enqueue(self, kind: str, payload: dict[str, Any] | None = None, **fields: Any) -> jobs_pb2.Job:
        struct = struct_pb2.Struct()
        struct.update(payload or {})
        request = jobs_pb2.EnqueueRequest(kind=kind, payload=struct, **fields)
        response = self._jobs.Enqueue(request, metadata=self._metadata, timeout=10)
        return response.job

    def get(self, job_id: str) -> jobs_pb2.Job:
        response = self._jobs.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=self._metadata, timeout=10)
        return response.job

    def stats(self) -> admin_pb2.GetQueueStatsResponse:
        return self._admin.GetQueueStats(
            admin_pb2.GetQueueStatsRequest(), metadata=self._metadata, timeout=10
        )

    def create_schedule(self, schedule_id: str, cron: str, kind: str) -> schedules_pb2.Schedule:
        request = schedules_pb2.CreateScheduleRequest(
            schedule_id=schedule_id, cron=cron, job=schedules_pb2.ScheduleJob(kind=kind)
        )
        return self._schedules.CreateSchedule(request, metadata=self._metadata, timeout=10).schedule

    def schedule(self, schedule_id: str) -> schedules_pb2.Schedule:
        request = schedules_pb2.GetScheduleRequest(schedule_id=schedule_id)
        return self._schedules.GetSchedule(request, metadata=self._metadata, timeout=10).schedule

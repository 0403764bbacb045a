"""What the dashboard refuses, as a process: a sign-in token far longer than
any the API takes is a 401 like any wrong token (it used to reach the API and
come back RESOURCE_EXHAUSTED, shown as a 429)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.credentials import token_file
from tests.dashboard.test_serve import Browserless
from tests.support import sqlite_url
from tests.system.helpers import Leasehold

pytestmark = pytest.mark.slow


@pytest.fixture
def token_dashboard(tmp_path: Path, processes: Callable[[Leasehold], Leasehold]) -> tuple[Browserless, str]:
    path, (ann,) = token_file(tmp_path / "tokens", "owner:ann")
    server = processes(
        Leasehold.serve(
            sqlite_url(tmp_path),
            "--auth",
            "token",
            "--token-file",
            str(path),
            "--dashboard-listen",
            "127.0.0.1:0",
        )
    )
    server.start()
    return Browserless(str(server.events("server.started")[0]["dashboard"])), ann


@pytest.mark.parametrize("length", [16 * 1024 + 1, 100 * 1024])
def test_an_oversized_sign_in_token_is_a_401(token_dashboard: tuple[Browserless, str], length: int) -> None:
    web, ann = token_dashboard
    status, landed, page = web.sign_in("x" * length)
    assert (status, landed.removeprefix(web.base)) == (401, "/signin")
    assert "that token was not accepted" in page
    status, landed, _ = web.sign_in(ann)  # and the right one still signs in
    assert (status, landed.removeprefix(web.base)) == (200, "/overview")

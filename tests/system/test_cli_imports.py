"""A command imports only the stack it runs on: building the parser (any `--help`)
and running a client command against a real server load none of what `serve`
runs on. Each command runs in a fresh interpreter, whose `sys.modules` afterwards
says what it imported."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import OWNER, sqlite_url
from tests.system.helpers import REPO_ROOT, Client, Leasehold, child_env

pytestmark = pytest.mark.slow

# What `serve` runs on: the database, the dashboard's web stack, the metrics
# registry, the in-process runtime and the storage engines.
SERVER_STACK = (
    "sqlalchemy",
    "alembic",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "leasehold._server.runtime",
    "leasehold._server.dashboard",
    "leasehold._server.jobs.sql",
    "leasehold._server.app",
)

# Runs `leasehold ARGS` as the console script does, then writes its exit status and
# every module it imported to the file named first.
PROBE = """
import json, sys
from leasehold._server.cli.main import main
try:
    status = main(sys.argv[2:])
except SystemExit as exit:
    status = exit.code
with open(sys.argv[1], "w") as out:
    json.dump({"status": status, "modules": sorted(sys.modules)}, out)
"""


def imported(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """The probe's report for `leasehold ARGS`, and what the command printed."""
    report = tmp_path / "modules.json"
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *args],
        cwd=REPO_ROOT,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(report.read_text()), run.stdout


def server_stack(modules: list[str]) -> list[str]:
    """The modules of SERVER_STACK among `modules` (not merely sharing a prefix)."""
    return [
        name for name in modules if any(name == root or name.startswith(f"{root}.") for root in SERVER_STACK)
    ]


@pytest.mark.parametrize("args", [["--help"], ["serve", "--help"], ["jobs", "list", "--help"]])
def test_help_builds_the_whole_parser_without_the_server_stack(tmp_path: Path, args: list[str]) -> None:
    report, printed = imported(tmp_path, *args)
    assert report["status"] == 0 and printed.startswith("usage: leasehold"), printed
    stack = server_stack(report["modules"])
    assert stack == [], stack


def test_jobs_get_against_a_real_server_loads_only_the_client(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold]
) -> None:
    server = processes(Leasehold.serve(sqlite_url(tmp_path)))
    port = server.start()
    with Client(port) as client:
        job = client.enqueue("example.echo", {"hello": "world"})

    report, printed = imported(
        tmp_path, "jobs", "get", job.id, "--server", f"127.0.0.1:{port}", "--owner", OWNER, "-o", "json"
    )

    assert report["status"] == 0
    assert json.loads(printed)["id"] == job.id  # the call was made, and answered
    assert "leasehold.client" in report["modules"]
    stack = server_stack(report["modules"])
    assert stack == [], stack

"""The public package in use the way a user's project uses it: a handler module
of their own, outside this repository, written against `leasehold.worker` only,
served from a directory that also holds a `server.py` and a `server/` package of
the user's own, with that directory on the import path (as the README's
`--handlers` instructions put it). Leasehold installs nothing under the
top-level name `server`, so neither is ever imported."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import sqlite_url
from tests.system.helpers import Client, Leasehold, event_payload, types

USERS_HANDLERS = """
from leasehold.worker import HandlerRegistry, JobContext, PermanentError


async def double(ctx: JobContext) -> None:
    n = ctx.payload.get("n")
    if not isinstance(n, int | float):
        raise PermanentError("payload needs a number n")
    await ctx.raise_if_cancelled()
    await ctx.append_event("doubled", {"value": n * 2})


def register(registry: HandlerRegistry) -> None:
    registry.register("user.double", double)
"""
# What the user's own modules do when imported: leave a mark the test can see.
USERS_SERVER = "import pathlib\npathlib.Path(__file__).with_name('IMPORTED-{name}').write_text('yes')\n"


def _users_project(root: Path) -> Path:
    project = root / "project"
    (project / "server").mkdir(parents=True)
    (project / "server.py").write_text(USERS_SERVER.format(name="module"))
    (project / "server" / "__init__.py").write_text(USERS_SERVER.format(name="package"))
    (project / "server" / "runtime.py").write_text("raise ImportError('the user’s server.runtime')\n")
    (project / "myjobs.py").write_text(USERS_HANDLERS)
    return project


LAUNCHERS = {
    # The console script pip installs, as the README's quick start runs it.
    "console-script": (str(Path(sys.executable).with_name("leasehold")),),
    # `python -m leasehold` puts the working directory first on the import path.
    "python-m": (sys.executable, "-m", "leasehold"),
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_users_handler_module_runs_beside_their_own_server_module_and_package(
    tmp_path: Path, processes: Callable[[Leasehold], Leasehold], launcher: str
) -> None:
    project = _users_project(tmp_path)
    server = processes(
        Leasehold.serve(
            sqlite_url(tmp_path),
            "--handlers",
            "myjobs",
            env={"PYTHONPATH": str(project)},
            cwd=project,
            command=LAUNCHERS[launcher],
        )
    )
    server.start()

    with Client(server.port or 0) as client:
        job = client.enqueue("user.double", {"n": 21})
        done = client.wait_terminal(job.id)
        events = client.all_events(job.id)

    assert done.status == 3, server.output[-2000:]  # JOB_STATUS_SUCCEEDED
    assert types(events) == ["job.queued", "job.started", "doubled", "job.succeeded"]
    assert event_payload(events[2]) == {"value": 42}
    assert not list(project.glob("IMPORTED-*")), "the user's own server module or package was imported"

"""Without the `otel` extra the service runs as it always has: the tracing
module stands in with no-ops, a traced job still runs, and asking for export
is a clear configuration error. Each runs in a child process whose imports of
OpenTelemetry fail, as they would where the extra is not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support import sqlite_url
from tests.system.helpers import REPO_ROOT, child_env, run_cli

# Put first in a child's program: every `import opentelemetry...` then raises
# ImportError, as it does where the package is absent.
WITHOUT_OTEL = "import sys\nsys.modules['opentelemetry'] = None\n"

RUN_A_TRACED_JOB = """
import asyncio

from leasehold._server import tracing
from leasehold._server.clock import ManualClock
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import JobStatus, NewJob
from leasehold._server.runtime.executor import AttemptExecutor
from leasehold._server.runtime.registry import HandlerRegistry

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def main() -> None:
    assert not tracing.AVAILABLE
    assert tracing.export_from_environment({}, "leasehold").description == "off"
    repository = MemoryJobRepository(ManualClock())
    registry = HandlerRegistry()
    ran = []

    async def handler(ctx):
        ran.append(ctx.job_id)

    registry.register("test.traced", handler)
    job, _ = await repository.enqueue(NewJob("owner-1", "test.traced", {}, traceparent=TRACEPARENT))
    (claimed,) = (await repository.claim("w", 1, 30.0)).jobs
    await AttemptExecutor(repository, registry, 30.0).execute(claimed)
    done = await repository.get("owner-1", job.id)
    assert done.status is JobStatus.SUCCEEDED, done
    assert ran == [job.id] and done.traceparent == TRACEPARENT
    print("ran-without-otel")


asyncio.run(main())
"""


def _python(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL + textwrap.dedent(program)],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_traced_job_runs_without_opentelemetry() -> None:
    done = _python(RUN_A_TRACED_JOB)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ran-without-otel")


def test_asking_for_export_without_the_extra_is_a_config_error(tmp_path: Path) -> None:
    """`leasehold serve` as main() runs it, in a child that has no OpenTelemetry."""
    program = f"""
        from leasehold._server.cli.main import main
        sys.exit(main(["serve", "--database-url", {sqlite_url(tmp_path)!r}, "--listen", "127.0.0.1:0"]))
    """
    child = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL + textwrap.dedent(program)],
        cwd=REPO_ROOT,
        env=child_env({"OTEL_TRACES_EXPORTER": "otlp"}),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert child.returncode == 2, child.stderr
    assert child.stderr.strip().splitlines()[-1] == (
        "leasehold: OTEL_TRACES_EXPORTER: otlp needs the otel extra; pip install 'leasehold[otel]'"
    )


def test_an_unknown_exporter_is_a_config_error_naming_the_variable(tmp_path: Path) -> None:
    done = run_cli(
        "serve",
        "--database-url",
        sqlite_url(tmp_path),
        "--listen",
        "127.0.0.1:0",
        env={"OTEL_TRACES_EXPORTER": "zipkin"},
    )

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "leasehold: OTEL_TRACES_EXPORTER: one of otlp, console, none"

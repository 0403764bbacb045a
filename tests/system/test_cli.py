"""`leasehold migrate` and `leasehold serve` as an operator meets them: schema
creation, configuration from flags and environment, and what a mistake looks like.

A configuration mistake must end the process with a non-zero status and one
readable line naming the offending field -- not a Python traceback.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import socket
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from leasehold.v1 import jobs_pb2
from tests.support import sqlite_url
from tests.system.helpers import (
    EXIT_SECONDS,
    REPO_ROOT,
    TEST_HANDLERS,
    Client,
    Leasehold,
    run_cli,
    sqlite_path,
    table_names,
    wait_until,
)

pytestmark = pytest.mark.slow

SCHEMA_TABLES = {"alembic_version", "jobs", "job_events"}


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def assert_clean_failure(result: subprocess.CompletedProcess[str], *names: str) -> None:
    """Non-zero exit; the last line names what is wrong; no traceback anywhere."""
    output = result.stderr + result.stdout
    assert result.returncode != 0, output
    assert "server.started" not in output
    assert "Traceback" not in output, output[-2000:]
    for name in names:
        assert name in last_line(result), output[-2000:]


# ----- migrate ---------------------------------------------------------------------------


def test_migrate_creates_the_schema_idempotently_and_serve_starts_on_it(database_url: str, processes) -> None:
    first = run_cli("migrate", "--database-url", database_url)
    assert first.returncode == 0, first.stderr
    assert "migrate.done" in first.stderr
    assert SCHEMA_TABLES <= table_names(database_url)
    with contextlib.closing(sqlite3.connect(sqlite_path(database_url))) as conn:
        (version,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()

    again = run_cli("migrate", "--database-url", database_url)
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    with contextlib.closing(sqlite3.connect(sqlite_path(database_url))) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(version,)]

    server = processes(Leasehold.serve(database_url))
    with Client(server.start()) as client:
        job = client.enqueue("example.echo", {"hello": "world"})
        assert client.wait_terminal(job.id).status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0


def test_serve_runs_on_uvloop_when_asked(tmp_path: Path, processes: Callable[[Leasehold], Leasehold]) -> None:
    server = processes(Leasehold.serve(sqlite_url(tmp_path), "--event-loop", "uvloop"))
    with Client(server.start()) as client:
        assert server.started.record["event_loop"] == "uvloop"
        job = client.enqueue("example.echo", {"loop": "uvloop"})
        assert client.wait_terminal(job.id).status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0


# ----- configuration mistakes -----------------------------------------------------------

BAD_CONFIG = [
    pytest.param(["--concurrency", "0"], {}, ["concurrency"], id="concurrency-0"),
    pytest.param(["--concurrency", "5000"], {}, ["concurrency"], id="concurrency-above-max"),
    pytest.param(["--concurrency", "abc"], {}, ["--concurrency"], id="concurrency-not-a-number"),
    pytest.param(["--lease-seconds", "1"], {}, ["lease_seconds"], id="lease-seconds-1"),
    pytest.param(["--poll-seconds", "0.01"], {}, ["poll_seconds"], id="poll-seconds-0.01"),
    pytest.param(["--listen", "nonsense"], {}, ["listen", "nonsense"], id="listen-nonsense"),
    pytest.param(["--log-level", "chatty"], {}, ["log_level"], id="log-level-chatty"),
    pytest.param(["--event-loop", "tokio"], {}, ["event_loop"], id="event-loop-unknown"),
    pytest.param([], {"LEASEHOLD_CONCURRENCY": "abc"}, ["LEASEHOLD_CONCURRENCY"], id="env-concurrency-abc"),
    pytest.param([], {"LEASEHOLD_LEASE_SECONDS": "soon"}, ["LEASEHOLD_LEASE_SECONDS"], id="env-lease-soon"),
    pytest.param(
        ["--handlers", "no.such.module"], {}, ["handlers", "no.such.module"], id="handlers-missing-module"
    ),
    pytest.param(["--handlers", "json"], {}, ["handlers", "register"], id="handlers-module-without-register"),
    pytest.param(["--kind-limit", "pdf.render=0"], {}, ["--kind-limit", "pdf.render=0"], id="kind-limit-0"),
    pytest.param(["--kind-rate", "pdf.render=fast"], {}, ["--kind-rate", "R/s"], id="kind-rate-garbled"),
    pytest.param(
        [], {"LEASEHOLD_OWNER_LIMIT": "-3"}, ["LEASEHOLD_OWNER_LIMIT"], id="env-owner-limit-negative"
    ),
    pytest.param(["--retention", "2w"], {}, ["--retention", "30s, 15m, 12h, 7d"], id="retention-weeks"),
    pytest.param([], {"LEASEHOLD_RETENTION": "-1d"}, ["LEASEHOLD_RETENTION"], id="env-retention-negative"),
    pytest.param(["--metrics-listen", "9100"], {}, ["--metrics-listen", "HOST:PORT"], id="metrics-no-host"),
    pytest.param(
        [],
        {"LEASEHOLD_METRICS_LISTEN": "127.0.0.1:99999"},
        ["LEASEHOLD_METRICS_LISTEN"],
        id="env-metrics-port",
    ),
    pytest.param(
        ["--metrics-listen", "no-such-host.invalid:9100"],
        {},
        ["--metrics-listen", "cannot bind"],
        id="metrics-host",
    ),
    pytest.param(["--shutdown-grace", "-1"], {}, ["shutdown_grace"], id="shutdown-grace-negative"),
    pytest.param(
        [], {"LEASEHOLD_MAX_WATCH_STREAMS": "lots"}, ["LEASEHOLD_MAX_WATCH_STREAMS"], id="env-max-streams"
    ),
]


@pytest.mark.parametrize(("args", "env", "names"), BAD_CONFIG)
def test_bad_configuration_fails_with_one_clear_line(
    tmp_path: Path, args: list[str], env: dict[str, str], names: list[str]
) -> None:
    url = sqlite_url(tmp_path)
    result = run_cli("serve", "--database-url", url, "--listen", "127.0.0.1:0", *args, env=env, timeout=30)
    assert_clean_failure(result, *names)


def test_listen_on_a_busy_port_fails_with_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "serve", "--database-url", sqlite_url(tmp_path), "--listen", f"127.0.0.1:{port}", timeout=30
        )
    assert_clean_failure(result, "listen", str(port))


def test_metrics_on_a_busy_port_fails_with_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "serve",
            "--database-url",
            sqlite_url(tmp_path),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            f"127.0.0.1:{port}",
            timeout=30,
        )
    assert_clean_failure(result, "--metrics-listen", str(port))


@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_unopenable_database_fails_with_one_clear_line(tmp_path: Path, command: str) -> None:
    url = sqlite_url(tmp_path / "no" / "such" / "dir")
    extra = ["--listen", "127.0.0.1:0"] if command == "serve" else []
    result = run_cli(command, "--database-url", url, *extra, timeout=30)
    assert_clean_failure(result, "database")


def test_unsupported_database_url_fails_with_one_clear_line() -> None:
    result = run_cli(
        "serve",
        "--database-url",
        "postgresql+asyncpg://user:pw@localhost/db",
        "--listen",
        "127.0.0.1:0",
        timeout=30,
    )
    assert_clean_failure(result, "database_url")
    assert "postgresql+psycopg://" in result.stderr  # says what to use instead


def test_unreachable_postgres_fails_with_one_clear_line() -> None:
    """Nothing listens on port 1: the connection is refused, the start-up
    migration says so in one line, and the process does not hang."""
    result = run_cli(
        "serve",
        "--database-url",
        "postgresql+psycopg://leasehold@127.0.0.1:1/leasehold",
        "--listen",
        "127.0.0.1:0",
        timeout=30,
    )
    assert_clean_failure(result, "database_url")


def test_a_pool_size_out_of_range_fails_with_one_clear_line(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "--database-url",
        sqlite_url(tmp_path),
        "--database-pool-size",
        "0",
        "--listen",
        "127.0.0.1:0",
    )
    assert_clean_failure(result, "database_pool_size")


def test_migrate_ignores_serve_only_environment(database_url: str) -> None:
    result = run_cli("migrate", "--database-url", database_url, env={"LEASEHOLD_CONCURRENCY": "abc"})
    assert result.returncode == 0, result.stderr
    assert SCHEMA_TABLES <= table_names(database_url)


# ----- configuration that works ---------------------------------------------------------


def test_serve_takes_its_whole_configuration_from_the_environment(tmp_path: Path, processes) -> None:
    url = sqlite_url(tmp_path, "from-env.db")
    default_db = REPO_ROOT / "leasehold.db"
    default_existed = default_db.exists()
    server = processes(
        Leasehold(
            "serve",
            env={
                "LEASEHOLD_DATABASE_URL": url,
                "LEASEHOLD_LISTEN": "127.0.0.1:0",
                "LEASEHOLD_CONCURRENCY": "3",
            },
        )
    )
    port = server.start()
    started = server.started.record
    assert started["listen"] == "127.0.0.1:0" and port > 0
    assert sqlite_path(url).exists()
    assert default_db.exists() == default_existed  # the default path was not used

    # Concurrency 3: of four long jobs, three run and one waits.
    with Client(port) as client:
        for _ in range(4):
            client.enqueue("example.sleep", {"seconds": 20, "steps": 200})

        def three_running_one_queued() -> bool:
            statuses = sorted(job.status for job in client.list_all())
            assert statuses.count(jobs_pb2.JOB_STATUS_RUNNING) <= 3
            return statuses == [jobs_pb2.JOB_STATUS_QUEUED] + [jobs_pb2.JOB_STATUS_RUNNING] * 3

        wait_until(three_running_one_queued, timeout=10, what="three running jobs and one queued")
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0


def test_flags_win_over_the_environment(tmp_path: Path, processes) -> None:
    flag_url = sqlite_url(tmp_path, "flag.db")
    env_url = sqlite_url(tmp_path, "env.db")
    env = {"LEASEHOLD_DATABASE_URL": env_url, "LEASEHOLD_LISTEN": "nonsense"}
    server = processes(Leasehold.serve(flag_url, env=env))
    server.start()
    assert sqlite_path(flag_url).exists() and not sqlite_path(env_url).exists()
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0


def test_concurrency_1024_is_accepted(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url, "--concurrency", "1024"))
    with Client(server.start()) as client:
        jobs = [client.enqueue("example.echo", {"n": n}) for n in range(5)]
        for job in jobs:
            assert client.wait_terminal(job.id).status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0


def test_handlers_from_several_modules_are_all_served(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url, "--handlers", *TEST_HANDLERS))
    server.start()
    started = server.started.record
    assert {"example.echo", "example.sleep", "example.fail", "test.record"} <= set(started["kinds"])
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0


# ----- --version -------------------------------------------------------------------------


def test_version_prints_the_installed_version_and_exits_0() -> None:
    result = run_cli("--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"leasehold {importlib.metadata.version('leasehold')}\n"
    assert result.stderr == ""

"""`leasehold worker` as an operator meets it: configuration mistakes name the
setting and exit 2; a running worker logs what it is, never its token or the
jobs' payloads, and SIGTERM hands an unfinished job back."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest

from leasehold._server.cli import main
from tests.remote_worker.fake_server import TOKEN, fake_server
from tests.remote_worker.handlers import SECRET_PAYLOAD_MARKER
from tests.system.helpers import REPO_ROOT, child_env

HANDLERS = "tests.remote_worker.handlers"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LEASEHOLD_WORKER_TOKEN", "LEASEHOLD_SERVER", "LEASEHOLD_HANDLERS", "LEASEHOLD_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("argv", "environment", "setting"),
    [
        (["--server", "127.0.0.1:1", "--handlers", HANDLERS], {}, "LEASEHOLD_WORKER_TOKEN"),
        (
            ["--server", "127.0.0.1:1", "--handlers", HANDLERS],
            {"LEASEHOLD_WORKER_TOKEN": "short"},
            "LEASEHOLD_WORKER_TOKEN",
        ),
        (["--handlers", HANDLERS], {"LEASEHOLD_WORKER_TOKEN": TOKEN}, "server"),
        (["--server", "127.0.0.1:1"], {"LEASEHOLD_WORKER_TOKEN": TOKEN}, "handlers"),
        (
            ["--server", "127.0.0.1:1", "--handlers", "no.such.module"],
            {"LEASEHOLD_WORKER_TOKEN": TOKEN},
            "handlers",
        ),
        (
            ["--server", "127.0.0.1:1", "--handlers", HANDLERS, "--concurrency", "many"],
            {"LEASEHOLD_WORKER_TOKEN": TOKEN},
            "--concurrency",
        ),
        (
            ["--server", "127.0.0.1:1", "--handlers", HANDLERS],
            {"LEASEHOLD_WORKER_TOKEN": TOKEN, "LEASEHOLD_CONCURRENCY": "0"},
            "concurrency",
        ),
        (
            ["--server", "127.0.0.1:1", "--handlers", HANDLERS, "--kinds", "remote.other"],
            {"LEASEHOLD_WORKER_TOKEN": TOKEN},
            "kinds",
        ),
    ],
)
def test_a_configuration_mistake_is_one_line_naming_the_setting_and_exit_2(
    argv: list[str],
    environment: dict[str, str],
    setting: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main.main(["worker", *argv]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"leasehold: {setting}"), lines


async def test_the_worker_process_runs_a_job_and_sigterm_hands_the_running_one_back() -> None:
    async with fake_server() as (service, address):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "leasehold",
            "worker",
            "--handlers",
            HANDLERS,
            cwd=REPO_ROOT,
            env=child_env(
                {"LEASEHOLD_WORKER_TOKEN": TOKEN, "LEASEHOLD_SERVER": address, "LEASEHOLD_WORKER_ID": "w-1"}
            ),
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await service.enqueue("remote.double", {"n": 21, "secret": SECRET_PAYLOAD_MARKER})
            await service.until(lambda: bool(service.named("Complete")), timeout=30)
            held = await service.enqueue("remote.hold")
            await service.until(lambda: len(service.named("Heartbeat")) >= 1, timeout=30)
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.stderr is not None
        stderr = (await process.stderr.read()).decode()
    assert process.returncode == 0, stderr
    assert dict(service.named("Complete")[0].request.result) == {"doubled": 42}
    assert [call.request.job_id for call in service.named("Snooze")] == [held]
    records = [json.loads(line) for line in stderr.splitlines()]
    started = next(record for record in records if record["event"] == "worker.started")
    assert (started["worker_id"], started["server"]) == ("w-1", address)
    assert started["kinds"] == ["remote.add-up", "remote.double", "remote.hold"]
    assert TOKEN not in stderr
    assert SECRET_PAYLOAD_MARKER not in stderr
    assert not any("payload" in record or "result" in record for record in records)

"""`leasehold.testing.ServerProcess`, the harness the process tests and the bench both start
servers with, on a stand-in server (a few lines of Python that log the `server.started` line),
so each case takes an interpreter start rather than a real server's; the tests that start
`leasehold serve` itself (tests/system, tests/dashboard, ...) use it through tests.system.helpers.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from leasehold.testing import ServerNotStarted, ServerProcess, ServerStarted, started_record, stop_servers

STARTED = {"event": "server.started", "listen": "0.0.0.0:0", "port": 4321, "dashboard": "off"}
# Logs a line, then the started record, then waits for SIGTERM and exits 0.
STAND_IN = f"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("warming up", flush=True)
print({json.dumps(json.dumps(STARTED))}, file=sys.stderr, flush=True)
time.sleep(600)
"""


def test_only_the_started_record_is_read_from_a_line() -> None:
    assert started_record(json.dumps(STARTED)) == STARTED
    assert started_record(json.dumps(STARTED).encode()) == STARTED
    assert started_record('{"event": "server.stopping", "note": "server.started"}') is None
    assert started_record("server.started, but not JSON") is None
    started = ServerStarted(STARTED)
    assert (started.port, started.address, started.dashboard, started.metrics) == (
        4321,
        "127.0.0.1:4321",
        None,
        None,
    )


@pytest.mark.parametrize("sink", ["pipe", "log"])
def test_a_server_is_started_read_and_stopped(tmp_path: Path, sink: str) -> None:
    seen: list[str] = []
    log = tmp_path / "server.log" if sink == "log" else None
    on_line = seen.append if sink == "pipe" else None
    with ServerProcess([sys.executable, "-c", STAND_IN], log=log, on_line=on_line) as server:
        assert server.wait_started(60).record == STARTED
        if sink == "pipe":  # what the hook keeps already holds the line once the wait returns
            assert any(started_record(line) for line in seen) and seen[0] == "warming up\n"
        assert stop_servers([server], timeout=60) == [0]
    assert server.returncode == 0


def test_a_server_that_exits_first_raises_with_its_status_and_output(tmp_path: Path) -> None:
    crash = "import sys; print('no database here'); sys.exit(2)"
    for log in (None, tmp_path / "crash.log"):
        server = ServerProcess([sys.executable, "-c", crash], log=log)
        with pytest.raises(ServerNotStarted) as raised:
            server.wait_started(60)
        assert raised.value.returncode == 2 and "no database here" in raised.value.output


def test_a_server_that_ignores_sigterm_is_killed_after_the_bounded_wait() -> None:
    deaf = STAND_IN.replace("lambda *_: sys.exit(0)", "signal.SIG_IGN")
    server = ServerProcess([sys.executable, "-c", deaf])
    server.wait_started(60)
    assert server.stop(timeout=1) is None
    assert server.returncode == -signal.SIGKILL

"""The listeners' bounds without a server: the flags and their defaults, the caps
derived from the descriptor limit, the grpc options they become, and the loop
exception handler that turns asyncio's failed accepts into one line now and then."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import structlog

from leasehold._server.cli import main, serve, serve_flags
from leasehold._server.config import Settings
from leasehold._server.connections import (
    ACCEPT_FAILED_MESSAGE,
    RESERVED_DESCRIPTORS,
    AcceptFailures,
    ConnectionLimits,
    RateLimitedRecords,
    grpc_options,
)

FLAGS = (
    "GRPC_MAX_CONNECTIONS",
    "DASHBOARD_MAX_CONNECTIONS",
    "HANDSHAKE_TIMEOUT_SECONDS",
    "CONNECTION_IDLE_SECONDS",
)


def parsed(*args: str) -> Settings:
    return serve.settings_from(main.parser().parse_args(["serve", *args]))


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FLAGS:
        monkeypatch.delenv(f"LEASEHOLD_{name}", raising=False)


def test_the_defaults_and_the_flags() -> None:
    assert parsed().connections == ConnectionLimits(None, None, 10.0, 300.0)
    limits = parsed(
        "--grpc-max-connections",
        "500",
        "--dashboard-max-connections",
        "50",
        "--handshake-timeout-seconds",
        "2.5",
        "--connection-idle-seconds",
        "60",
    ).connections
    assert limits == ConnectionLimits(500, 50, 2.5, 60.0)


def test_the_environment_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEHOLD_GRPC_MAX_CONNECTIONS", "123")
    monkeypatch.setenv("LEASEHOLD_CONNECTION_IDLE_SECONDS", "30")
    limits = parsed("--connection-idle-seconds", "45").connections
    assert (limits.grpc_max_connections, limits.connection_idle_seconds) == (123, 45.0)  # the flag wins


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--grpc-max-connections", "0"], "--grpc-max-connections"),
        (["--dashboard-max-connections", "2.5"], "--dashboard-max-connections"),
        (["--grpc-max-connections", "lots"], "--grpc-max-connections"),
        (["--handshake-timeout-seconds", "0"], "handshake_timeout_seconds"),
        (["--connection-idle-seconds", "nan"], "connection_idle_seconds"),
        (["--connection-idle-seconds", "-5"], "connection_idle_seconds"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(args: list[str], named: str) -> None:
    with pytest.raises(serve_flags.ConfigError) as refused:
        parsed(*args)
    assert str(refused.value).startswith(named)


def test_the_caps_leave_the_reserve_free_under_the_descriptor_limit() -> None:
    caps = ConnectionLimits().caps(1_024, database_pool_size=20)
    assert caps.grpc + caps.dashboard + RESERVED_DESCRIPTORS + 20 <= 1_024
    assert caps.grpc > 3 * caps.dashboard - 3  # three quarters to one
    assert caps.fits
    generous = ConnectionLimits().caps(1_048_576, database_pool_size=20)
    assert (generous.grpc, generous.dashboard) == (10_000, 1_000)
    # Set by flag beyond the limit: kept, but said not to fit.
    too_many = ConnectionLimits(grpc_max_connections=5_000).caps(1_024, database_pool_size=20)
    assert too_many.grpc == 5_000 and not too_many.fits
    # A tiny limit still gives each listener one connection.
    tiny = ConnectionLimits().caps(64, database_pool_size=20)
    assert tiny.grpc >= 1 and tiny.dashboard >= 1


def test_the_grpc_options() -> None:
    options = dict(
        grpc_options(ConnectionLimits(handshake_timeout_seconds=1.5, connection_idle_seconds=60), 700)
    )
    assert options == {
        "grpc.server_handshake_timeout_ms": 1_500,
        "grpc.max_connection_idle_ms": 60_000,
        "grpc.max_allowed_incoming_connections": 700,
    }


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _accept_failed() -> dict[str, Any]:
    return {"message": ACCEPT_FAILED_MESSAGE, "exception": OSError(24, "Too many open files")}


async def test_failed_accepts_are_one_line_per_interval_with_a_count() -> None:
    loop = asyncio.get_running_loop()
    clock = FakeClock()
    passed_on: list[dict[str, Any]] = []
    handler = AcceptFailures(lambda _, context: passed_on.append(context), interval=10.0, clock=clock)
    with structlog.testing.capture_logs() as logged:
        for _ in range(1_000):  # a burst: one line at once
            handler(loop, _accept_failed())
        clock.now = 9.9
        handler(loop, _accept_failed())
        clock.now = 10.0
        handler(loop, _accept_failed())  # the next line, counting what it stood for
    assert [(line["event"], line["failed"]) for line in logged] == [
        ("server.accept_failed", 1),
        ("server.accept_failed", 1_001),  # 999 of the burst, then two more
    ]
    assert logged[0]["reason"] == "[Errno 24] Too many open files"
    assert passed_on == []


async def test_every_other_report_goes_on_unchanged() -> None:
    loop = asyncio.get_running_loop()
    passed_on: list[dict[str, Any]] = []
    handler = AcceptFailures(lambda _, context: passed_on.append(context))
    other = {"message": "Task exception was never retrieved", "exception": ValueError("x")}
    handler(loop, other)
    handler(loop, other)
    assert passed_on == [other, other]


async def test_install_keeps_the_previous_handler() -> None:
    loop = asyncio.get_running_loop()
    passed_on: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: passed_on.append(context))
    try:
        installed = AcceptFailures.install(loop)
        assert loop.get_exception_handler() is installed
        loop.call_exception_handler({"message": "something else"})
        with structlog.testing.capture_logs() as logged:
            loop.call_exception_handler(_accept_failed())
        assert passed_on == [{"message": "something else"}]
        assert [line["event"] for line in logged] == ["server.accept_failed"]
    finally:
        loop.set_exception_handler(None)


def test_uvicorn_repeats_are_rate_limited() -> None:
    quiet = RateLimitedRecords(("Exceeded concurrency limit.",))

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message, None, None)

    assert [quiet.filter(record("Exceeded concurrency limit.")) for _ in range(3)] == [True, False, False]
    assert quiet.filter(record("something else"))

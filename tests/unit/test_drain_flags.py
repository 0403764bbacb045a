"""`serve`'s drain and limit flags: the defaults, the flag, LEASEHOLD_<FLAG>, and
the one-line refusal naming the setting for a bad value."""

from __future__ import annotations

import pytest

from leasehold._server.api.watch_streams import WatchLimits
from leasehold._server.cli import main, serve, serve_flags
from leasehold._server.config import Settings
from leasehold._server.jobs.owner_limits import OwnerLimits


def parsed(*args: str) -> Settings:
    return serve.settings_from(main.parser().parse_args(["serve", *args]))


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "SHUTDOWN_GRACE",
        "MAX_WATCH_STREAMS",
        "MAX_WATCH_STREAMS_PER_OWNER",
        "MAX_EVENTS_PER_JOB",
        "MAX_KINDS_PER_OWNER",
        "MAX_RESOURCE_TYPES_PER_OWNER",
        "MAX_SCHEDULES_PER_OWNER",
        "METRICS_KINDS",
    ):
        monkeypatch.delenv(f"LEASEHOLD_{name}", raising=False)


def test_the_defaults() -> None:
    settings = parsed()
    assert settings.shutdown_grace_seconds == 20.0
    assert settings.watch_limits == WatchLimits(max_streams=10_000, max_streams_per_owner=1_000)
    assert settings.max_events_per_job == 10_000
    assert settings.owner_limits == OwnerLimits(max_kinds=1000, max_resource_types=1000, max_schedules=1000)
    assert settings.metrics_kinds == ()


def test_the_per_owner_limits_and_metrics_kinds_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEHOLD_MAX_SCHEDULES_PER_OWNER", "7")
    monkeypatch.setenv("LEASEHOLD_METRICS_KINDS", "billing.*, reports.daily")
    settings = parsed("--max-kinds-per-owner", "0", "--max-resource-types-per-owner", "20")
    assert settings.owner_limits == OwnerLimits(max_kinds=0, max_resource_types=20, max_schedules=7)
    assert settings.metrics_kinds == ("billing.*", "reports.daily")
    assert parsed("--metrics-kinds", "a.*,b.c", "d.*").metrics_kinds == ("a.*", "b.c", "d.*")


def test_flags_and_environment_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEHOLD_MAX_WATCH_STREAMS_PER_OWNER", "7")
    monkeypatch.setenv("LEASEHOLD_SHUTDOWN_GRACE", "99")
    settings = parsed("--shutdown-grace", "2.5", "--max-watch-streams", "50", "--max-events-per-job", "300")
    assert settings.shutdown_grace_seconds == 2.5  # the flag wins over the environment
    assert settings.watch_limits == WatchLimits(max_streams=50, max_streams_per_owner=7)
    assert settings.max_events_per_job == 300
    assert parsed("--shutdown-grace", "0").shutdown_grace_seconds == 0.0  # hand back at once


@pytest.mark.parametrize(
    ("args", "environment", "named"),
    [
        (["--shutdown-grace", "-1"], {}, "shutdown_grace"),
        (["--shutdown-grace", "soon"], {}, "--shutdown-grace"),
        (["--shutdown-grace", "nan"], {}, "shutdown_grace"),
        ([], {"LEASEHOLD_SHUTDOWN_GRACE": "7200"}, "shutdown_grace"),
        (["--max-watch-streams", "0"], {}, "max_watch_streams"),
        (["--max-watch-streams-per-owner", "1.5"], {}, "--max-watch-streams-per-owner"),
        ([], {"LEASEHOLD_MAX_WATCH_STREAMS_PER_OWNER": "0"}, "max_watch_streams_per_owner"),
        (["--max-events-per-job", "0"], {}, "max_events_per_job"),
        ([], {"LEASEHOLD_MAX_EVENTS_PER_JOB": "many"}, "LEASEHOLD_MAX_EVENTS_PER_JOB"),
        (["--max-kinds-per-owner", "-1"], {}, "max_kinds_per_owner"),
        (["--max-resource-types-per-owner", "lots"], {}, "--max-resource-types-per-owner"),
        ([], {"LEASEHOLD_MAX_SCHEDULES_PER_OWNER": "-5"}, "max_schedules_per_owner"),
        (["--metrics-kinds", "Not A Kind"], {}, "metrics_kinds"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, args: list[str], environment: dict[str, str], named: str
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(serve_flags.ConfigError) as refused:
        parsed(*args)
    assert named in str(refused.value)
    assert "\n" not in str(refused.value)

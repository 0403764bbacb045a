"""How long the command line's watches and calls keep trying: --wait bounds calls
(15 s by default) and, only when given, a watch's reconnecting; by default a
watch waits out a restart however long its drain takes."""

from __future__ import annotations

import argparse

import pytest

from leasehold._server.cli import client_flags


@pytest.fixture(autouse=True)
def no_wait_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEASEHOLD_WAIT", raising=False)


def test_without_wait_a_watch_reconnects_as_long_as_the_job_runs() -> None:
    args = argparse.Namespace(wait=None)

    assert client_flags.watch_deadline(args) is None
    assert client_flags.wait_seconds(args) == client_flags.DEFAULT_WAIT_SECONDS  # calls stay bounded


def test_a_given_wait_bounds_a_watchs_reconnecting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert client_flags.watch_deadline(argparse.Namespace(wait="2.5")) == 2.5
    assert client_flags.watch_deadline(argparse.Namespace(wait="0")) == 0.0
    monkeypatch.setenv("LEASEHOLD_WAIT", "7")
    assert client_flags.watch_deadline(argparse.Namespace(wait=None)) == 7.0
    assert client_flags.watch_deadline(argparse.Namespace(wait="1")) == 1.0  # the flag wins


def test_a_bad_wait_is_a_usage_error_for_a_watch_too() -> None:
    with pytest.raises(client_flags.UsageError, match="wait"):
        client_flags.watch_deadline(argparse.Namespace(wait="forever"))

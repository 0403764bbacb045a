"""`leasehold --help` and every command's help speak of commands and flags,
never of the source files behind them (a new user read "worker_cli.py" there)."""

from __future__ import annotations

import re

import pytest

from leasehold._server.cli.main import main

COMMANDS = [
    [],
    ["serve"],
    ["migrate"],
    ["worker"],
    ["worker-conformance"],
    ["token"],
    ["jobs"],
    ["schedules"],
    ["admin"],
]
SOURCE_NAMES = re.compile(r"\w+\.py\b|\w+_cli\b|client_cli")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda words: " ".join(words) or "leasehold")
def test_help_names_no_source_file(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: leasehold")
    assert not SOURCE_NAMES.findall(text), text


def test_the_top_level_help_says_what_the_commands_are_for(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "`leasehold serve` runs the service" in text
    assert "LEASEHOLD_<FLAG>" in text

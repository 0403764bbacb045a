"""The CLI's tables show data as it is: a job's error message or resource id is
never read as rich markup (which would drop `[i]` as a style, and end the
command with a MarkupError traceback on `[/x]`)."""

from __future__ import annotations

import pytest

from leasehold._server.cli.output import Output


def test_bracketed_values_are_printed_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    Output("table").fields([("error_message", "bad [i]input[/i] and a stray [/x] tag")])
    assert "bad [i]input[/i] and a stray [/x] tag" in capsys.readouterr().out

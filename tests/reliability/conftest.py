"""The reliability suite's figures: each experiment reports what it measured
(rounds, recovery times, counts) through the `figures` fixture, and the run ends
with one table of them, so the numbers quoted in a closing note come from a run
anyone can repeat with `python -m pytest tests/reliability`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

_FIGURES: list[tuple[str, str, Any]] = []

Figures = Callable[[str, Any], None]


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    """`figures(name, value)` records one figure under the test's name."""

    def record(name: str, value: Any) -> None:
        _FIGURES.append((request.node.nodeid.split("::", 1)[-1], name, value))

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    current = None
    for test, name, value in _FIGURES:
        if test != current:
            terminalreporter.write_line(test)
            current = test
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        terminalreporter.write_line(f"    {name:<40} {shown}")

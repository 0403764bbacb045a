"""The handler and handler-testing snippets, pasted as a new user would paste
them, from both places that show them: the README's five-minute path (steps 5
and 6) and docs/handlers.md ("Writing a handler", "Testing a handler"). The
handler module, the pytest setting and the test file go into an empty
directory, and `python -m pytest` runs there in a process of its own, with
nothing of this repository's configuration."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.helpers import REPO_ROOT, child_env

pytestmark = pytest.mark.slow

FENCE = re.compile(r"```(?:python|toml)\n(.*?)```", re.DOTALL)


PAGES = ("README.md", "docs/handlers.md")


def snippet(page: str, first_line: str) -> str:
    """The code block of `page` whose first line is `first_line`."""
    blocks = [
        block for block in FENCE.findall((REPO_ROOT / page).read_text()) if block.startswith(first_line)
    ]
    assert len(blocks) == 1, f"{page}: expected one code block starting {first_line!r}, found {len(blocks)}"
    return blocks[0]


@pytest.mark.parametrize("page", PAGES)
def test_the_handler_and_its_tests_pass_as_pasted(page: str, tmp_path: Path) -> None:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "jobs.py").write_text(snippet(page, "# myapp/jobs.py\n"))
    (tmp_path / "myapp" / "test_jobs.py").write_text(snippet(page, "# myapp/test_jobs.py\n"))
    (tmp_path / "pyproject.toml").write_text(snippet(page, "# pyproject.toml"))

    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert finished.returncode == 0, finished.stdout + finished.stderr
    test_count = snippet(page, "# myapp/test_jobs.py\n").count("\nasync def test_")
    assert test_count == 5
    assert f"{test_count} passed" in finished.stdout, finished.stdout

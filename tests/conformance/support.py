"""Running `leasehold worker-conformance` on a worker command and reading its
verdicts, for the conformance tests of every worker."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from leasehold._server.conformance.rules import RULES
from tests.system.helpers import REPO_ROOT, child_env

RULE_NAMES = tuple(RULES)
# The tool's own bound on a run, and the test's bound on the tool: both only
# tell a hang from a slow machine (a full run takes about a minute).
TOOL_TIMEOUT_SECONDS = 200
PROCESS_TIMEOUT_SECONDS = 260
# How long the tool gets to clean up after SIGTERM.
STOP_SECONDS = 30
VERDICT = re.compile(r"^(PASS|FAIL|SKIP) (\w+): (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def verdicts(self) -> dict[str, str]:
        """Rule name to PASS, FAIL or SKIP."""
        return {rule: outcome for outcome, rule, _ in VERDICT.findall(self.stdout)}

    @property
    def report(self) -> str:
        return f"exit {self.returncode}\n{self.stdout}\n{self.stderr[-4000:]}"


def conformance(command: Sequence[str], rules: Sequence[str] = (), env: dict[str, str] | None = None) -> Run:
    """`leasehold worker-conformance [--rules ...] -- command`, from the repository root."""
    chosen = ["--rules", *rules] if rules else []
    args = [
        sys.executable,
        "-m",
        "leasehold",
        "worker-conformance",
        "--timeout-seconds",
        str(TOOL_TIMEOUT_SECONDS),
        *chosen,
        "--",
        *command,
    ]
    process = subprocess.Popen(
        args,
        cwd=REPO_ROOT,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=PROCESS_TIMEOUT_SECONDS)
    except BaseException:
        # SIGTERM first (a hang, or the test's own timeout): the tool then
        # stops the server and the worker it started, which a SIGKILL would
        # leave running.
        process.terminate()
        try:
            process.communicate(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        raise
    return Run(process.returncode, stdout, stderr)


def assert_every_rule_passed(run: Run) -> None:
    assert run.verdicts == dict.fromkeys(RULE_NAMES, "PASS"), run.report
    assert run.returncode == 0, run.report
    assert f"{len(RULE_NAMES)} passed, 0 failed, 0 skipped" in run.stdout, run.report

"""`leasehold worker-conformance` judges workers as the wire guide says: the raw
reference worker passes every rule, each of its broken variants fails exactly
the rule that checks what it breaks, and the two SDK workers (`leasehold
worker` and the TypeScript one) pass every rule.

The runs are independent (each its own server, proxy and worker), so they run
side by side, a few at a time, started when the module's first test asks; each
test then waits for its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.conformance.support import RULE_NAMES, Run, assert_every_rule_passed, conformance
from tests.examples.test_node_sdk import PACKAGE, installed_as_locked, npm
from tests.support import require

# A test waits for its run, which may have waited for others before it
# started (PARALLEL_RUNS at a time): a hang, not a slow machine, should end it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# Runs at once: enough that the module takes about as long as its longest runs,
# few enough that a loaded two-core machine still answers within the rules'
# deadlines (a second or so).
PARALLEL_RUNS = 4
RAW_WORKER = [sys.executable, "-m", "tests.conformance.raw_worker"]
LEASEHOLD_WORKER = [sys.executable, "-m", "leasehold", "worker", "--handlers", "leasehold.conformance"]
TYPESCRIPT_WORKER = ["node", str(PACKAGE / "examples" / "conformance-worker.mjs")]


def node_available() -> bool:
    return shutil.which("node") is not None and shutil.which("npm") is not None


def typescript_run() -> Run | None:
    """Build the package as tests/examples/test_node_sdk.py does, then run its
    conformance worker; None without Node.js."""
    if not node_available():
        return None
    if not installed_as_locked():
        installed = npm("ci", "--no-audit", "--no-fund", "--prefer-offline", timeout=300)
        assert installed.returncode == 0, installed.stderr[-3000:]
    built = npm("run", "build", timeout=120)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return conformance(TYPESCRIPT_WORKER)


# Every run this module may need, by name, longest first.
RUNS: dict[str, Callable[[], Run | None]] = {
    "raw": lambda: conformance(RAW_WORKER),
    "leasehold-worker": lambda: conformance(LEASEHOLD_WORKER),
    "typescript": typescript_run,
    **{
        f"broken-{rule}": (lambda rule=rule: conformance(RAW_WORKER, [rule], {"RAW_WORKER_BREAK": rule}))
        for rule in RULE_NAMES
    },
}


# The run each test waits for (the parametrized broken ones: by their rule).
TEST_RUNS = {
    "test_the_raw_reference_worker_passes_every_rule": "raw",
    "test_leasehold_worker_passes_every_rule": "leasehold-worker",
    "test_the_typescript_sdk_worker_passes_every_rule": "typescript",
}


def _wanted(item: pytest.Item) -> str | None:
    """The run a collected test of this module waits for, if any."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "rule" in callspec.params:
        return f"broken-{callspec.params['rule']}"
    return TEST_RUNS.get(getattr(item, "originalname", item.name))


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[Run | None]]]:
    """Only the runs the selected tests need, all started at once."""
    module = request.module
    needed = {_wanted(item) for item in request.session.items if item.module is module}
    with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        yield {name: pool.submit(run) for name, run in RUNS.items() if name in needed}


def result(runs: dict[str, Future[Run | None]], name: str) -> Run | None:
    return runs[name].result(timeout=600)


def test_the_raw_reference_worker_passes_every_rule(runs: dict[str, Future[Run | None]]) -> None:
    run = result(runs, "raw")
    assert run is not None
    assert_every_rule_passed(run)


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_a_raw_worker_broken_for_one_rule_fails_that_rule(
    rule: str, runs: dict[str, Future[Run | None]]
) -> None:
    run = result(runs, f"broken-{rule}")
    assert run is not None
    assert run.verdicts == {rule: "FAIL"}, run.report
    assert run.returncode == 1, run.report
    assert f"FAIL {rule}: " in run.stdout, run.report


def test_leasehold_worker_passes_every_rule(runs: dict[str, Future[Run | None]]) -> None:
    run = result(runs, "leasehold-worker")
    assert run is not None
    assert_every_rule_passed(run)


def test_the_typescript_sdk_worker_passes_every_rule(runs: dict[str, Future[Run | None]]) -> None:
    require(node_available(), "Node.js and npm (for clients/node)")
    run = result(runs, "typescript")
    assert run is not None
    assert_every_rule_passed(run)


def test_bad_usage_exits_2_naming_the_mistake() -> None:
    for args, named in (
        (["--rules", "no_such_rule", "--", "true"], "--rules"),
        ([], "COMMAND"),
        (["--timeout-seconds", "soon", "--", "true"], "--timeout-seconds"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "leasehold", "worker-conformance", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert named in done.stderr, done.stderr

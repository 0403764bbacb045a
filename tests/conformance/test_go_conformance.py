"""`examples/go-worker` under `leasehold worker-conformance`: built as
tests/examples/test_go_worker.py builds it (offline, from Debian's Go
packages), it runs the conformance handler for LEASEHOLD_KIND, reading
LEASEHOLD_SERVER and LEASEHOLD_WORKER_TOKEN as the tool sets them, and
passes every rule."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conformance.support import assert_every_rule_passed, conformance
from tests.examples.test_go_worker import EXAMPLE, debian_go_packages
from tests.support import require
from tests.system.helpers import REPO_ROOT

# The build, then one full run: about a minute each, more on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def go_worker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(
        shutil.which("go") is not None and debian_go_packages(),
        "Go and Debian's grpc/protobuf Go packages (apt-get install golang-go golang-google-grpc-dev"
        " golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev)",
    )
    binary = tmp_path_factory.mktemp("go-worker") / "go-worker"
    env = {**os.environ, "GOCACHE": os.environ.get("GOCACHE", str(REPO_ROOT / ".cache" / "go-build"))}
    built = subprocess.run(
        [str(EXAMPLE / "build"), str(binary)], env=env, capture_output=True, text=True, timeout=600
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return binary


@pytest.mark.parametrize("worker", ["go"])
def test_the_go_example_worker_passes_every_rule(worker: str, go_worker: Path) -> None:
    assert_every_rule_passed(conformance([str(go_worker)]))

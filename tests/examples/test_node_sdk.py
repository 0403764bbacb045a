"""The TypeScript package `clients/node` (`@leasehold/client`) is built and its
own test suite (node's test runner) run, against real `leasehold serve`
processes it starts itself: Client and Worker end to end, and the tarball
`npm pack` makes, installed into an empty project."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support import require
from tests.system.helpers import REPO_ROOT, child_env

pytestmark = pytest.mark.slow

PACKAGE = REPO_ROOT / "clients" / "node"


def npm(*args: str, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["npm", *args],
        cwd=PACKAGE,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def installed_as_locked() -> bool:
    """node_modules was installed from the current package-lock.json (npm writes
    its own copy of the lock into node_modules on install): `npm ci` would
    only wipe and reinstall the same files."""
    installed = PACKAGE / "node_modules" / ".package-lock.json"
    lock = PACKAGE / "package-lock.json"
    return installed.exists() and installed.stat().st_mtime >= lock.stat().st_mtime


# The bound is the sum of the npm steps' own: a loaded CI machine has run the
# suite alone for two minutes, which the default would cut off mid-run.
@pytest.mark.timeout(300 + 60 + 120 + 480)
def test_the_typescript_client_and_worker_pass_their_own_suite() -> None:
    require(
        shutil.which("node") is not None and shutil.which("npm") is not None,
        "Node.js and npm (for clients/node)",
    )
    if not installed_as_locked():
        installed = npm("ci", "--no-audit", "--no-fund", "--prefer-offline", timeout=300)
        assert installed.returncode == 0, installed.stderr[-3000:]
    formatted = npm("run", "check-format", timeout=60)
    assert formatted.returncode == 0, formatted.stdout[-3000:] + formatted.stderr[-3000:]
    built = npm("run", "build", timeout=120)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # The suite starts its servers with this interpreter's `leasehold`.
    tested = npm("test", timeout=480, LEASEHOLD_SERVE_COMMAND=f"{sys.executable} -m leasehold")
    report = tested.stdout[-6000:] + tested.stderr[-3000:]
    assert tested.returncode == 0, report
    assert "# fail 0" in tested.stdout, report
    assert "# pass 0" not in tested.stdout, report

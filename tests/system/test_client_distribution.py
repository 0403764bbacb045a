"""The client-only distribution for real: `leasehold-client` built as a wheel from
clients/python, installed into a fresh virtual environment (grpcio and protobuf
come from the package index, through pip's cache), without the server's stack,
running the README's example against a real `leasehold serve`; and it coexists
with the server distribution in one environment without overwriting its files."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.system.helpers import REPO_ROOT, Leasehold, child_env

pytestmark = pytest.mark.slow

EXAMPLE = REPO_ROOT / "examples" / "python-client" / "enqueue_and_watch.py"


def run(*args: str | Path, cwd: Path = REPO_ROOT, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(arg) for arg in args], cwd=cwd, env=child_env(env), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


# What the two distributions are built from; copied, so that setuptools' build/
# and egg-info directories land in a temporary directory, not in the clone.
SOURCES = ("pyproject.toml", "README.md", "src", "server", "generated", "migrations", "clients/python")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sources")
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for name in SOURCES:
        source, target = REPO_ROOT / name, root / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            shutil.copy2(source, target)
    return root


def build_wheel(source: Path, into: Path) -> Path:
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", into, source)
    (wheel,) = into.glob("*.whl")
    return wheel


def record(wheel: Path) -> dict[str, str]:
    """path -> sha256 of every file a wheel installs (its RECORD)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(item for item in archive.namelist() if item.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(archive.read(name).decode()))
        return {row[0]: row[1] for row in rows if ".dist-info/" not in row[0]}


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory, sources: Path) -> Path:
    return build_wheel(sources / "clients" / "python", tmp_path_factory.mktemp("client-wheel"))


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory, client_wheel: Path) -> Path:
    """One fresh environment with only leasehold-client (and what it depends on)."""
    directory = tmp_path_factory.mktemp("client-venv")
    venv.EnvBuilder(with_pip=True).create(directory)
    python = directory / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", client_wheel)
    return python


def test_the_client_wheel_holds_the_client_and_the_stubs_only(client_wheel: Path) -> None:
    files = record(client_wheel)
    assert "leasehold/client/_watch.py" in files and "leasehold/v1/jobs_pb2_grpc.py" in files
    assert {path.split("/")[1] for path in files} == {"client", "v1"}
    assert "leasehold/__init__.py" not in files  # the server distribution's, never overwritten


def test_the_example_runs_from_the_client_only_install(client_venv: Path, tmp_path: Path, processes) -> None:
    # Run from a directory outside the clone, so nothing of the repository is importable.
    absent = subprocess.run(
        [client_venv, "-c", "import sqlalchemy"], cwd=tmp_path, capture_output=True, text=True
    )
    assert absent.returncode != 0 and "No module named 'sqlalchemy'" in absent.stderr
    server = processes(Leasehold.serve(f"sqlite+aiosqlite:///{tmp_path / 'leasehold.db'}"))
    port = server.start()
    output = run(client_venv, EXAMPLE, cwd=tmp_path, env={"LEASEHOLD_SERVER": f"127.0.0.1:{port}"})
    lines = output.splitlines()
    assert lines[0].startswith("enqueued job_")
    assert [line for line in lines if line.startswith("progress")] == [f"progress {n}/4" for n in range(1, 5)]
    assert lines[-2:] == [lines[-2], "status JOB_STATUS_SUCCEEDED"] and lines[-2].endswith("job.succeeded")


def test_both_distributions_install_into_one_environment(
    client_venv: Path, client_wheel: Path, sources: Path, tmp_path: Path
) -> None:
    """The files both ship (client and stubs) are the same bytes, so either install
    order leaves a working `leasehold`: its __version__, its client, its stubs."""
    server_wheel = build_wheel(sources, tmp_path / "server-wheel")
    shared = record(client_wheel).keys() & record(server_wheel).keys()
    assert shared == record(client_wheel).keys()
    assert {path: record(client_wheel)[path] for path in shared} == {
        path: record(server_wheel)[path] for path in shared
    }
    # The server's dependencies are not needed to show whose files are whose.
    run(client_venv, "-m", "pip", "install", "--quiet", "--no-deps", server_wheel)
    probe = "import leasehold, leasehold.client, leasehold.v1.admin_pb2; print(leasehold.__version__)"
    assert run(client_venv, "-c", probe, cwd=tmp_path).strip() == "0.1.0"

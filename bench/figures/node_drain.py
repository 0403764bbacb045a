"""Node drain: jobs/s of N pre-seeded no-op jobs run by Node.js worker processes, measured exactly
as bench.figures.remote_drain measures `leasehold worker` (and with its code), against `serve`'s
in-process runtime and against a hand-written Node worker, all in the same round.

Every case uses SQLite, the kind `bench.remote-noop` and a fresh copy of the remote drain's
template, held back and released by the start gate (bench.gate) once every worker process has
logged `worker.started`, so process start-up is outside the figure:

* in_process (the baseline of ts_w1 and ts_w2): `serve --concurrency 64`, the kind local;
* unary_w1 (the baseline of ts_w1): one bench/node/unary_worker.js at concurrency 64, what a
  careful team writes by hand from the protos with @grpc/grpc-js and @grpc/proto-loader (as
  examples/node-worker does): a long-poll Claim for the free slots, one unary Complete per job,
  one batched Heartbeat per interval;
* ts_w1, ts_w2: bench/node/sdk_worker.mjs, the TypeScript SDK (`@leasehold/client`, the built
  clients/node package) with `worker.handle(kind, async () => ({}))` and every option at its
  default but the concurrency: one process at 64, or two at 32 each (64 slots in all, as every
  case here has).

The workers run against `serve --remote-kinds bench.remote-noop` (its in-process runtime then
never claims the kind). Figure: N / (latest `completed_at` - earliest `started_at`), the server's
own stamps; every job must have succeeded at its first attempt, or the figure fails.

What it needs: `node` and `npm` on PATH. The pinned dependencies of clients/node and examples are
installed (`npm ci`) where a fresh clone has none, and the SDK is built (`npm run build`,
offline) when clients/node/dist is missing or older than its sources, once per bench run, so the
figure never measures a stale build. Without Node the in-process baseline is still measured and
the Node figures are reported as skipped, saying what to install.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from bench.common import REPO_ROOT, BenchError, progress
from bench.context import RoundContext, RoundItem, Skipped
from bench.figures.remote_drain import KIND, StartWorkers, drain, held_back_copy, measure_in_process
from bench.procs import ServerProcess, WorkerProcess, start_workers

SDK_PACKAGE = REPO_ROOT / "clients" / "node"
EXAMPLES = REPO_ROOT / "examples"
SDK_WORKER = REPO_ROOT / "bench" / "node" / "sdk_worker.mjs"
UNARY_WORKER = REPO_ROOT / "bench" / "node" / "unary_worker.js"
BUILD_TIMEOUT = 300.0
# Held while the Node packages are installed, built and run from: `npm ci` deletes
# node_modules before it installs and `npm run build` rewrites dist/, so another
# user of them at the same time (a second bench, a test) would see a half-built tree.
# tests/conftest.py takes the same lock.
PACKAGES_LOCK = REPO_ROOT / ".cache" / "node-packages.lock"

IN_PROCESS = "leasehold.node_drain.in_process"
UNARY_W1 = "leasehold.node_drain.unary_w1"
TS_W1 = "leasehold.node_drain.ts_w1"
TS_W2 = "leasehold.node_drain.ts_w2"
NODE_FIGURES = (UNARY_W1, TS_W1, TS_W2)

_built = False  # the SDK was found fresh (or built) in this bench run


def missing() -> str | None:
    """Why the Node workers cannot run here, or None. Dependencies that are
    not installed yet are not missing while npm is there to install them
    (`ensure_built`), as a fresh clone has none."""
    if shutil.which("node") is None:
        return "Node.js not found (apt-get install nodejs npm, then npm ci in clients/node and examples)"
    if shutil.which("npm") is not None:
        return None
    if not _installed(SDK_PACKAGE):
        return "clients/node has no node_modules and npm is not found: run `npm ci` in clients/node"
    if not _dist_fresh():
        return "clients/node/dist is missing or stale and npm is not found to build it"
    if not _installed(EXAMPLES):
        return "examples has no node_modules (@grpc/grpc-js) and npm is not found: run `npm ci` in examples"
    return None


def _installed(package: Path) -> bool:
    marker = "@connectrpc/connect-node" if package == SDK_PACKAGE else "@grpc/grpc-js"
    return (package / "node_modules" / marker).is_dir()


def _npm(directory: Path, package: Path, *args: str) -> None:
    """One npm command in `package`, its output kept in the round's directory."""
    log_path = directory / f"npm-{package.name}-{args[0]}.log"
    with open(log_path, "wb") as log:
        code = subprocess.run(
            ["npm", *args],
            cwd=package,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT,
        ).returncode
    if code != 0:
        raise BenchError(
            f"npm {' '.join(args)} in {package.name} failed ({code}):\n{log_path.read_text()[-3000:]}"
        )


def _dist_fresh() -> bool:
    built = SDK_PACKAGE / "dist" / "index.js"
    if not built.exists():
        return False
    sources = [
        *(SDK_PACKAGE / "src").rglob("*.ts"),
        SDK_PACKAGE / "tsconfig.json",
        SDK_PACKAGE / "package.json",
    ]
    return built.stat().st_mtime >= max(path.stat().st_mtime for path in sources)


def ensure_built(directory: Path) -> None:
    """Install the pinned dependencies of clients/node and examples where they
    are not installed (`npm ci`, from npm's cache when it has them), and build
    clients/node (`npm run build`: tsc, offline) unless dist/ is newer than its
    sources."""
    global _built
    if _built:
        return
    for package in (SDK_PACKAGE, EXAMPLES):
        if not _installed(package):
            progress(f"installing {package.name}'s dependencies (npm ci)")
            _npm(directory, package, "ci", "--no-audit", "--no-fund", "--prefer-offline")
    if not _dist_fresh():
        progress("building clients/node (npm run build)")
        _npm(directory, SDK_PACKAGE, "run", "build")
        if not _dist_fresh():
            raise BenchError("npm run build in clients/node left dist/ older than its sources")
    _built = True


def _node_workers(ctx: RoundContext, name: str, script: Path, concurrency: int, count: int) -> StartWorkers:
    def start(server: ServerProcess) -> list[WorkerProcess]:
        args = ["node", str(script), "--server", server.target, "--kind", KIND]
        args += ["--concurrency", str(concurrency)]
        return start_workers(ctx.directory, args, count, name=f"{name}-worker")

    return start


def measure_node(
    ctx: RoundContext, figure: str, name: str, script: Path, runtime: str, workers: int
) -> RoundItem:
    """`workers` processes of `script` sharing `drain_concurrency` slots between them."""
    concurrency = ctx.sizes.drain_concurrency // workers
    database = held_back_copy(ctx, name)
    params = {
        "workers": workers,
        "runtime": runtime,
        "concurrency_per_process": concurrency,
        "total_concurrency": concurrency * workers,
    }
    start = _node_workers(ctx, name, script, concurrency, workers)
    return drain(ctx, database, figure, name, start, params)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """The in-process baseline first, then the hand-written unary worker, then the SDK worker in
    one and in two processes, each on a fresh held-back copy."""
    yield measure_in_process(ctx, IN_PROCESS, "node-drain-in-process")
    reason = missing()
    if reason is not None:
        yield Skipped(NODE_FIGURES, reason)
        return
    with packages_in_turn():
        yield from _measure_workers(ctx)


@contextlib.contextmanager
def packages_in_turn() -> Iterator[None]:
    """The Node packages to this process alone until the block ends (PACKAGES_LOCK)."""
    PACKAGES_LOCK.parent.mkdir(exist_ok=True)
    with PACKAGES_LOCK.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _measure_workers(ctx: RoundContext) -> Iterator[RoundItem]:
    ensure_built(ctx.directory)
    cases = (
        (UNARY_W1, "node-drain-unary-w1", UNARY_WORKER, "node unary (@grpc/grpc-js)", 1),
        (TS_W1, "node-drain-ts-w1", SDK_WORKER, "node @leasehold/client", 1),
        (TS_W2, "node-drain-ts-w2", SDK_WORKER, "node @leasehold/client", 2),
    )
    # A figure that fails (a job lost or run twice) does not keep the others from being measured;
    # the group still fails at its end, naming every figure that did.
    failures: list[str] = []
    for figure, name, script, runtime, workers in cases:
        try:
            yield measure_node(ctx, figure, name, script, runtime, workers)
        except BenchError as error:
            progress(f"  {figure} FAILED: {str(error)[:400]}")
            failures.append(str(error))
    if failures:
        raise BenchError("\n".join(failures))

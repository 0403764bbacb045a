"""(a) Enqueue RPC/s at concurrency 1/16/64, against baseline 1, the no-op gRPC unary server.

Both servers run at once in their own processes (the idle one costs nothing measurable); for
each concurrency the no-op server is measured and then Leasehold, back to back, by the same
closed-loop client (bench.load.closed_loop) in a child process: warm-up, then a timed window.

Leasehold runs `serve --concurrency 1` on an empty database and the load enqueues `bench.hold`,
whose handler never returns: the first job is claimed and held, every later one stays queued, so
the runtime does no work while Enqueue is measured (one job is held; its heartbeat every 10 s
is the only other write).

Figure (h) reuses `pairs()` at concurrency 64 with both servers on uvloop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from bench.common import FigureSkipped, Measurement
from bench.context import RoundContext, RoundItem, Skipped
from bench.load import ENQUEUE_METHOD, enqueue_request
from bench.procs import ServerProcess, leasehold_server, noop_server, run_child

HELD_KIND = "bench.hold"


def unary_rate(
    ctx: RoundContext, server: ServerProcess, concurrency: int, figure: str, side: str, connections: int = 1
) -> Measurement:
    sizes = ctx.sizes
    result = run_child(
        ctx.directory,
        f"load-{figure}",
        "bench.load:closed_loop",
        {
            "target": server.target,
            "method": ENQUEUE_METHOD,
            "request_hex": enqueue_request(HELD_KIND).hex(),
            "concurrency": concurrency,
            "warmup_seconds": sizes.enqueue_warmup_seconds,
            "window_seconds": sizes.enqueue_window_seconds,
            "connections": connections,
        },
        timeout=sizes.enqueue_warmup_seconds + sizes.enqueue_window_seconds + 90,
    )
    params = {
        "concurrency": concurrency,
        "client_processes": 1,
        "connections": connections,
        "warmup_s": sizes.enqueue_warmup_seconds,
        "window_s": sizes.enqueue_window_seconds,
        "calls": result["calls"],
    }
    return Measurement(figure, result["rate"], "rpc/s", side, params)


def pairs(ctx: RoundContext, concurrencies: tuple[int, ...], event_loop: str | None) -> Iterator[RoundItem]:
    """No-op then Leasehold at each concurrency; `event_loop` None = both servers' defaults. If
    Leasehold rejects the loop, the no-op figures are still measured and Leasehold's skipped."""
    suffix = "" if event_loop is None else f".{event_loop}"
    leasehold: ServerProcess | None = None
    with contextlib.ExitStack() as stack:
        noop = stack.enter_context(noop_server(ctx.directory, 1, event_loop or "asyncio"))
        try:
            leasehold = stack.enter_context(
                leasehold_server(ctx.directory, ctx.directory / "enqueue.db", 1, event_loop=event_loop)
            )
        except FigureSkipped as skip:
            yield Skipped(tuple(f"leasehold.enqueue.c{c}{suffix}" for c in concurrencies), str(skip))
        for c in concurrencies:
            baseline = unary_rate(ctx, noop, c, f"baseline.grpc_unary.c{c}{suffix}", "baseline")
            baseline.params["event_loop"] = event_loop or "asyncio"
            yield baseline
            if leasehold is not None:
                figure = unary_rate(ctx, leasehold, c, f"leasehold.enqueue.c{c}{suffix}", "leasehold")
                figure.params.update(event_loop=event_loop or "default", server_concurrency=1, kind=HELD_KIND)
                yield figure


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    yield from pairs(ctx, ctx.sizes.enqueue_concurrency, None)

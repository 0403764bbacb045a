"""Graphs of jobs (DESIGN §18): a chain's per-link latency, a drain of diamonds against a drain
of independent jobs, and what releasing children costs the parent's completing transaction,
on SQLite (group `graphs`) and on PostgreSQL (group `pg_graphs`).

Chain (`leasehold.graphs.chain.p50`, `.p99`; on PostgreSQL `leasehold.graphs.pg.chain.*`): one
`leasehold serve` at its defaults (no tuning flag; the in-process runtime runs the jobs) on a
fresh database. One client process sends the whole chain as one BatchEnqueue of `graphs_chain`
`bench.link` items, each naming itself by `ref` and the one before it in `depends_on_refs`
(job i waits for job i-1). The first link carries `run_at` = T0, a moment far enough ahead
that the call has been answered and the client has exited before anything runs; the bench
checks that it was. The latency of link i is its `started_at` minus link i-1's
`completed_at`: the server's own stamps, taken inside the transaction that claimed link i and
the one that recorded link i-1's success (which is also the one that released link i). p50
and p99 over the `graphs_chain - 1` links. Every job must have succeeded at its first attempt.

Beside it, `...chain.handler.p50`/`.p99` (no goal): the same links seen from the handler,
i.e. link i's handler entry minus link i-1's handler return (`bench.link` stamps
`time.monotonic()` on entry and just before it returns): what a user's code waits between
one step and the next, the parent's commit and the child's claim and dispatch included.

Diamonds against independent jobs (`leasehold.graphs.diamonds` / `leasehold.graphs.independent`,
both jobs/s, measured back to back in the same round, independent first): `graphs_diamonds`
diamonds of `graphs_diamond_size` `bench.noop` jobs, each one root, `graphs_diamond_size - 2`
middle jobs that wait for the root, and one sink that waits for every middle job; against as
many independent `bench.noop` jobs. Each is enqueued over gRPC by one client process in
BatchEnqueue calls of whole diamonds (10 diamonds, 1,000 items, a call; the independent jobs
in calls of the same size), with refs, into a `leasehold serve` at its defaults on a fresh
SQLite file. The jobs that wait for nothing (the roots; every independent job) carry `run_at`
= T0, after the last call has been answered (checked), so the drain starts from a full queue,
as the serve-drain figures' start gate does, through the API's own delayed work. Figure: N /
(latest `completed_at` - earliest `started_at`), the server's stamps, as in
bench.figures.serve_drain. The target divides diamonds by independent round by round.

Release costs (`leasehold.graphs.sqlite.*`, `leasehold.graphs.pg.*`, each in ms, no goal), through
`SqlJobRepository` in a child process on a fresh migrated database (a file; a new database
on the run's PostgreSQL cluster), timing the await of `succeed_status` (what the in-process
runtime calls; one transaction and its commit):

* `plain`: the median of `graphs_plain_succeeds` succeeds of jobs nothing waits for;
* `fanin`: `graphs_fanin_repeats` times, `graphs_fanin` parents and one child waiting for all
  of them (one enqueue_batch); the parents are claimed and succeeded one at a time. `fanin` is
  the median of the succeeds that count the child down, `fanin_last` the median of the last
  ones, which release it;
* `fanout`: one parent with `graphs_fanout` children (each enqueued with `depends_on` the
  parent's id, in batches of 1,000): the one succeed that releases them all. Its params give
  the cost per child, and the same for a parent with a tenth as many children, measured
  just before it: O(children) shows as equal costs per child.

After each, the bench checks with SQL that every child was released (queued, nothing pending,
due), so a figure can never time a release that did not happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2
from sqlalchemy import create_engine, func, select

from bench.common import (
    METADATA,
    OWNER,
    BenchError,
    Measurement,
    latency_summary,
    median,
    read_stamps,
    sqlite_url,
    wait_until,
)
from bench.context import RoundContext, RoundItem
from bench.figures.remote_drain import Progress
from bench.jobtable import JobTable
from bench.load import connect
from bench.postgres import PgDatabase
from bench.procs import leasehold_server, run_child
from bench.seed import sync_url
from leasehold._server import migrate
from leasehold._server.api.validation import BATCH_ENQUEUE_LIMIT
from leasehold._server.clock import SystemClock
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.sql.tables import job_dependencies, jobs
from leasehold._server.logs import configure_logging
from leasehold.v1 import jobs_pb2

BATCH_ENQUEUE_METHOD = "/leasehold.v1.JobService/BatchEnqueue"
NOOP_KIND = "bench.noop"
LINK_KIND = "bench.link"
CALL_TIMEOUT = 120.0
DRAIN_TIMEOUT = 600.0
# From the client's first call to T0: the chain is one call; a drain's N jobs take
# DRAIN_GATE_SECONDS plus this much per job (about 5x what this machine needs), so the last
# answer comes well before T0, which the bench checks with GATE_SLACK_SECONDS to spare.
CHAIN_GATE_SECONDS = 1.5
DRAIN_GATE_SECONDS = 1.5
DRAIN_GATE_PER_JOB = 0.0005
GATE_SLACK_SECONDS = 0.1

# The release costs' kinds: the parents are claimed by kind, the children never are.
PARENT_KIND = "bench.graph-parent"
CHILD_KIND = "bench.graph-child"
WORKER = "bench-releaser"
LEASE_SECONDS = 300
ENQUEUE_CHUNK = 1_000


# ----- shapes: BatchEnqueue items naming each other by ref ----------------------------------------


def _item(
    kind: str, ref: str, parents: Sequence[str] = (), run_at: float | None = None
) -> jobs_pb2.EnqueueRequest:
    payload = struct_pb2.Struct()
    payload.update({"n": 1})
    item = jobs_pb2.EnqueueRequest(kind=kind, payload=payload, ref=ref, depends_on_refs=list(parents))
    if run_at is not None:
        item.run_at.FromDatetime(datetime.fromtimestamp(run_at, UTC))
    return item


def chain(count: int, kind: str, run_at: float) -> list[list[jobs_pb2.EnqueueRequest]]:
    """One graph: `count` jobs, each waiting for the one before it; the first due at `run_at`."""
    return [
        [_item(kind, f"l{i}", [f"l{i - 1}"] if i else [], run_at if i == 0 else None) for i in range(count)]
    ]


def diamonds(count: int, size: int, kind: str, run_at: float) -> list[list[jobs_pb2.EnqueueRequest]]:
    """`count` graphs of `size` jobs: a root due at `run_at`, `size - 2` middle jobs waiting for
    it, and a sink waiting for every middle job."""
    if size < 3:
        raise BenchError(f"a diamond needs at least 3 jobs (got {size})")
    graphs = []
    for d in range(count):
        root = f"d{d}"
        middles = [f"d{d}.m{i}" for i in range(size - 2)]
        graphs.append(
            [
                _item(kind, root, run_at=run_at),
                *(_item(kind, ref, [root]) for ref in middles),
                _item(kind, f"d{d}.sink", middles),
            ]
        )
    return graphs


def independent(count: int, kind: str, run_at: float) -> list[list[jobs_pb2.EnqueueRequest]]:
    """`count` jobs that wait for nothing, each due at `run_at` (graphs of one, without refs)."""
    item = _item(kind, "", run_at=run_at)
    return [[item] for _ in range(count)]


def batches(
    graphs: Sequence[list[jobs_pb2.EnqueueRequest]], limit: int
) -> list[jobs_pb2.BatchEnqueueRequest]:
    """Whole graphs packed into BatchEnqueue calls of at most `limit` items (refs name items of
    their own call only, so a graph is never split)."""
    calls: list[list[jobs_pb2.EnqueueRequest]] = [[]]
    for graph in graphs:
        if len(graph) > limit:
            raise BenchError(f"a graph of {len(graph)} jobs does not fit one BatchEnqueue ({limit})")
        if len(calls[-1]) + len(graph) > limit:
            calls.append([])
        calls[-1].extend(graph)
    return [jobs_pb2.BatchEnqueueRequest(requests=items) for items in calls if items]


def shape_graphs(
    shape: str, count: int, size: int, kind: str, run_at: float
) -> list[list[jobs_pb2.EnqueueRequest]]:
    if shape == "chain":
        return chain(count, kind, run_at)
    if shape == "diamonds":
        return diamonds(count // size, size, kind, run_at)
    if shape == "independent":
        return independent(count, kind, run_at)
    raise BenchError(f"unknown shape {shape!r}")


async def enqueue_shape(
    target: str, shape: str, count: int, size: int, kind: str, gate_seconds: float
) -> dict[str, Any]:
    """Run in a child process: enqueue `count` jobs of `shape` over BatchEnqueue, one call in
    flight, the jobs that wait for nothing due at T0 = now + `gate_seconds`. Returns the job ids
    in item order, T0 and the wall clock just before the first call and after the last answer."""
    channel = await connect(target)
    try:
        call = channel.unary_unary(BATCH_ENQUEUE_METHOD)
        first_send_wall = time.time()
        due_wall = first_send_wall + gate_seconds
        requests = batches(shape_graphs(shape, count, size, kind, due_wall), BATCH_ENQUEUE_LIMIT)
        ids: list[str] = []
        for request in requests:
            raw = await call(request.SerializeToString(), metadata=METADATA, timeout=CALL_TIMEOUT)
            answer = jobs_pb2.BatchEnqueueResponse.FromString(raw)
            ids.extend(response.job.id for response in answer.responses)
        last_ack_wall = time.time()
    finally:
        await channel.close()
    if len(ids) != count or len(set(ids)) != count:
        raise BenchError(f"{shape}: {len(set(ids))} distinct jobs enqueued, expected {count}")
    return {
        "ids": ids,
        "calls": len(requests),
        "first_send_wall": first_send_wall,
        "last_ack_wall": last_ack_wall,
        "due_wall": due_wall,
    }


def _enqueue(
    ctx: RoundContext, target: str, name: str, shape: str, count: int, size: int, kind: str, gate: float
) -> dict[str, Any]:
    """Enqueue through a client process; raises BenchError when the last answer came too close
    to T0 (the drain would have begun while jobs were still being enqueued)."""
    sent: dict[str, Any] = run_child(
        ctx.directory,
        f"{name}-client",
        "bench.figures.graphs:enqueue_shape",
        {"target": target, "shape": shape, "count": count, "size": size, "kind": kind, "gate_seconds": gate},
        timeout=gate + DRAIN_TIMEOUT,
    )
    if sent["last_ack_wall"] > sent["due_wall"] - GATE_SLACK_SECONDS:
        took = sent["last_ack_wall"] - sent["first_send_wall"]
        raise BenchError(f"{name}: enqueueing {count} jobs took {took:.2f} s, past the {gate:g} s gate")
    return sent


# ----- the chain ----------------------------------------------------------------------------------


def measure_chain(ctx: RoundContext, database: Path | PgDatabase, prefix: str) -> list[Measurement]:
    """The chain on `database` (a fresh SQLite path, or a fresh PostgreSQL database)."""
    count = ctx.sizes.graphs_chain
    name = prefix.removeprefix("leasehold.").replace(".", "-")
    stamps_path = ctx.directory / f"{name}.stamps"
    target = database.url if isinstance(database, PgDatabase) else database
    env = {"BENCH_STAMPS": str(stamps_path)}
    with leasehold_server(ctx.directory, target, None, env=env, name=name) as server:
        sent = _enqueue(ctx, server.target, name, "chain", count, count, LINK_KIND, CHAIN_GATE_SECONDS)
        with JobTable(database) as table:
            progressing = Progress(prefix, table, count)
            wait_until(
                lambda: server.alive() and progressing.done(),
                DRAIN_TIMEOUT,
                f"{prefix}: every link to succeed",
                0.1,
            )
            stamps = table.stamps()
    ids: list[str] = sent["ids"]
    attempts = max(stamps[job_id][2] for job_id in ids)
    if attempts != 1:
        raise BenchError(f"{prefix}: a link ran {attempts} times")
    links: list[float] = []
    for parent, child in zip(ids, ids[1:], strict=False):
        completed, started = stamps[parent][1], stamps[child][0]
        if completed is None or started is None or started < completed:
            raise BenchError(f"{prefix}: {child} started at {started}, its parent completed at {completed}")
        links.append((started - completed) / 1e6)
    handler = _handler_links(stamps_path, ids)
    db_summary = latency_summary(links)
    handler_summary = latency_summary(handler)
    params = {
        "links": len(links),
        "engine": "postgresql" if isinstance(database, PgDatabase) else "sqlite",
        "server": "serve at its defaults (in-process runtime)",
        "measure": "child started_at - parent completed_at (server stamps)",
        "max_ms": round(db_summary["max"], 3),
        "chain_seconds": round((stamps[ids[-1]][1] or 0) / 1e6 - (stamps[ids[0]][0] or 0) / 1e6, 3),
        "first_claim_after_due_ms": round(((stamps[ids[0]][0] or 0) / 1e6 - sent["due_wall"]) * 1000, 1),
    }
    handler_params = {
        **params,
        "measure": "child handler entry - parent handler return (time.monotonic)",
        "max_ms": round(handler_summary["max"], 3),
    }
    return [
        *(Measurement(f"{prefix}.{p}", db_summary[p], "ms", "leasehold", params) for p in ("p50", "p99")),
        *(
            Measurement(f"{prefix}.handler.{p}", handler_summary[p], "ms", "leasehold", handler_params)
            for p in ("p50", "p99")
        ),
    ]


def _handler_links(stamps_path: Path, ids: list[str]) -> list[float]:
    """Each link's handler entry minus its parent's handler return, in seconds."""
    entered: dict[str, float] = {}
    returned: dict[str, float] = {}
    for key, sequence, at in read_stamps(stamps_path):
        (returned if sequence else entered)[key] = at
    missing = [job_id for job_id in ids if job_id not in entered or job_id not in returned]
    if missing:
        raise BenchError(f"chain: {len(missing)} links left no handler stamps")
    return [entered[child] - returned[parent] for parent, child in zip(ids, ids[1:], strict=False)]


# ----- diamonds against independent jobs ----------------------------------------------------------


def measure_drain(ctx: RoundContext, shape: str, figure: str) -> Measurement:
    """Drain `graphs_diamonds * graphs_diamond_size` jobs of `shape` (diamonds or independent)
    through `serve` at its defaults on a fresh SQLite file."""
    sizes = ctx.sizes
    size = sizes.graphs_diamond_size
    count = sizes.graphs_diamonds * size
    gate = DRAIN_GATE_SECONDS + DRAIN_GATE_PER_JOB * count
    database = ctx.directory / f"graphs-{shape}.db"
    name = f"graphs-{shape}"
    with leasehold_server(ctx.directory, database, None, name=name) as server:
        sent = _enqueue(ctx, server.target, name, shape, count, size, NOOP_KIND, gate)
        with JobTable(database) as table:
            progressing = Progress(figure, table, count)
            wait_until(
                lambda: server.alive() and progressing.done(),
                DRAIN_TIMEOUT,
                f"{figure}: every job to succeed",
                0.1,
            )
            done, first, last = table.succeeded_window()
            failed = table.status_count("failed") + table.status_count("cancelled")
            attempts = table.max_attempt()
    if done != count or failed or attempts != 1 or first is None or last is None:
        raise BenchError(
            f"{figure}: {done} of {count} jobs succeeded, {failed} did not, at most {attempts} attempts"
        )
    seconds = last - first
    params = {
        "jobs": count,
        "shape": (
            f"{sizes.graphs_diamonds} diamonds of {size}: 1 root -> {size - 2} middle -> 1 sink"
            if shape == "diamonds"
            else "independent"
        ),
        "engine": "sqlite",
        "server": "serve at its defaults (in-process runtime)",
        "enqueue": f"{sent['calls']} BatchEnqueue calls of up to {BATCH_ENQUEUE_LIMIT}",
        "enqueue_seconds": round(sent["last_ack_wall"] - sent["first_send_wall"], 3),
        "seconds": round(seconds, 3),
        "first_claim_after_due_ms": round((first - sent["due_wall"]) * 1000, 1),
    }
    return Measurement(figure, count / seconds, "jobs/s", "leasehold", params)


# ----- what releasing children costs the parent's transaction -------------------------------------


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _released(database_url: str, parent_ids: Sequence[str]) -> tuple[int, int]:
    """(children of `parent_ids` released: queued, nothing pending, due at a time the clock can
    name; children of them that are anything else)."""
    child = select(job_dependencies.c.child_id).where(job_dependencies.c.parent_id.in_(list(parent_ids)))
    released = (jobs.c.status == sm.QUEUED.value) & (jobs.c.pending_dependencies == 0)
    released &= jobs.c.available_at < sm.AWAITING_PARENTS
    statement = select(func.count().filter(released), func.count().filter(~released)).where(
        jobs.c.id.in_(child.scalar_subquery())
    )
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as conn:
            done, other = conn.execute(statement).one()
            return int(done), int(other)
    finally:
        engine.dispose()


async def release_costs(
    database_url: str, fanout: int, fanin: int, fanin_repeats: int, plain: int
) -> dict[str, Any]:
    """Run in a child process: the completing transaction's cost, in seconds, for jobs nothing
    waits for, the parents of a fan-in, and the parent of a fan-out (see the module docstring)."""
    configure_logging("warning")
    await asyncio.to_thread(migrate.upgrade, database_url)
    repo = SqlJobRepository(create_engines(database_url), SystemClock())
    parents_only = KindFilter(only=frozenset({PARENT_KIND}))

    async def claim(count: int) -> list[Any]:
        claimed = (await repo.claim(WORKER, count, LEASE_SECONDS, parents_only)).jobs
        if len(claimed) != count:
            raise BenchError(f"release costs: claimed {len(claimed)} parents, expected {count}")
        return claimed

    async def timed_succeed(claimed: Any) -> float:
        began = time.perf_counter()
        await repo.succeed_status(claimed.lease)
        return time.perf_counter() - began

    async def fan_out(children: int) -> float:
        parent, _ = await repo.enqueue(NewJob(OWNER, PARENT_KIND, {"fanout": children}))
        for start in range(0, children, ENQUEUE_CHUNK):
            await repo.enqueue_batch(
                [
                    NewJob(OWNER, CHILD_KIND, {"n": i}, depends_on=(parent.id,))
                    for i in range(start, min(children, start + ENQUEUE_CHUNK))
                ]
            )
        (claimed,) = await claim(1)
        seconds = await timed_succeed(claimed)
        released, waiting = await asyncio.to_thread(_released, database_url, [parent.id])
        if released != children or waiting:
            raise BenchError(f"fan-out: {released} of {children} children released, {waiting} waiting")
        return seconds

    try:
        await repo.enqueue_batch([NewJob(OWNER, PARENT_KIND, {"n": i}) for i in range(plain)])
        plain_seconds = [await timed_succeed(claimed) for claimed in await claim(plain)]

        counting: list[float] = []
        releasing: list[float] = []
        for _ in range(fanin_repeats):
            answers = await repo.enqueue_batch(
                [NewJob(OWNER, PARENT_KIND, {"n": i}) for i in range(fanin)]
                + [NewJob(OWNER, CHILD_KIND, {}, depends_on_items=tuple(range(fanin)))]
            )
            parent_ids = [job.id for job, _ in answers[:-1]]
            claimed = await claim(fanin)
            seconds = [await timed_succeed(one) for one in claimed]
            counting.extend(seconds[:-1])
            releasing.append(seconds[-1])
            released, waiting = await asyncio.to_thread(_released, database_url, parent_ids)
            if released != 1 or waiting:
                raise BenchError(f"fan-in: {released} child released, {waiting} waiting")

        small = max(1, fanout // 10)
        small_seconds = await fan_out(small)
        fanout_seconds = await fan_out(fanout)
    finally:
        await repo.close()
    return {
        "plain": plain_seconds,
        "fanin_counting": counting,
        "fanin_releasing": releasing,
        "fanout_small": small_seconds,
        "fanout_small_children": small,
        "fanout": fanout_seconds,
        "fanout_children": fanout,
    }


def measure_release_costs(ctx: RoundContext, database_url: str, engine: str) -> list[Measurement]:
    sizes = ctx.sizes
    result = run_child(
        ctx.directory,
        f"graphs-release-{engine}",
        "bench.figures.graphs:release_costs",
        {
            "database_url": database_url,
            "fanout": sizes.graphs_fanout,
            "fanin": sizes.graphs_fanin,
            "fanin_repeats": sizes.graphs_fanin_repeats,
            "plain": sizes.graphs_plain_succeeds,
        },
        timeout=1800,
    )
    prefix = f"leasehold.graphs.{engine}"
    common = {"engine": engine, "timed": "await succeed_status(lease): one transaction and its commit"}
    plain = [_ms(s) for s in result["plain"]]
    counting = [_ms(s) for s in result["fanin_counting"]]
    releasing = [_ms(s) for s in result["fanin_releasing"]]
    children, small_children = result["fanout_children"], result["fanout_small_children"]
    fanout_ms, small_ms = _ms(result["fanout"]), _ms(result["fanout_small"])
    return [
        Measurement(
            f"{prefix}.plain",
            median(plain),
            "ms",
            "leasehold",
            {
                **common,
                "succeeds": len(plain),
                "p99_ms": round(latency_summary([s / 1000 for s in plain])["p99"], 3),
            },
        ),
        Measurement(
            f"{prefix}.fanin",
            median(counting),
            "ms",
            "leasehold",
            {
                **common,
                "parents": sizes.graphs_fanin,
                "repeats": sizes.graphs_fanin_repeats,
                "what": "a parent's succeed that counts its one waiting child down (median)",
                "max_ms": round(max(counting), 3) if counting else None,
            },
        ),
        Measurement(
            f"{prefix}.fanin_last",
            median(releasing),
            "ms",
            "leasehold",
            {
                **common,
                "parents": sizes.graphs_fanin,
                "repeats": sizes.graphs_fanin_repeats,
                "what": "the last parent's succeed, which releases the child (median over repeats)",
            },
        ),
        Measurement(
            f"{prefix}.fanout",
            fanout_ms,
            "ms",
            "leasehold",
            {
                **common,
                "children": children,
                "what": "one parent's succeed releasing every child",
                "us_per_child": round(fanout_ms * 1000 / children, 2),
                "small_children": small_children,
                "small_ms": round(small_ms, 3),
                "small_us_per_child": round(small_ms * 1000 / small_children, 2),
            },
        ),
    ]


# ----- the groups ---------------------------------------------------------------------------------


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """SQLite: the chain, the independent drain then the diamonds' (back to back), and the
    release costs."""
    yield from measure_chain(ctx, ctx.directory / "graphs-chain.db", "leasehold.graphs.chain")
    yield measure_drain(ctx, "independent", "leasehold.graphs.independent")
    yield measure_drain(ctx, "diamonds", "leasehold.graphs.diamonds")
    yield from measure_release_costs(ctx, sqlite_url(ctx.directory / "graphs-release.db"), "sqlite")


def run_postgres(ctx: RoundContext) -> Iterator[RoundItem]:
    """PostgreSQL: the chain (no goal of its own) and the release costs, each on a fresh
    database of the run's cluster."""
    yield from measure_chain(ctx, ctx.postgres.database("graphs_chain"), "leasehold.graphs.pg.chain")
    yield from measure_release_costs(ctx, ctx.postgres.database("graphs_release").url, "pg")

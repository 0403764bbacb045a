"""The overview: the queue at a glance for an admin (GetQueueStats), every
job of an owner's at a glance for an owner (GetStats), and the owner's recent
events, live (Subscribe, streamed from `/feed/events`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from leasehold._server.dashboard.feed import feed_events
from leasehold._server.dashboard.sessions import Session
from leasehold._server.dashboard.stats import (
    CHART_HEIGHT,
    CHART_WIDTH,
    QUEUED_SAMPLE,
    STATUSES,
    owner_summary,
    throughput_bars,
)
from leasehold._server.dashboard.web import dashboard, message, render, signed_in
from leasehold.v1 import admin_pb2, jobs_pb2

# The overview's "Recent events" keeps this many, newest first; older rows
# leave the page as new ones come (a tab left open for days stays small).
FEED_ROWS = 50


@signed_in
async def overview(request: Request, session: Session) -> Response:
    if session.is_admin:
        return await _admin(request, session)
    return await _owner(request, session)


async def _admin(request: Request, session: Session) -> Response:
    state = dashboard(request)
    client = state.gateway.client(session.credential)
    stats: admin_pb2.GetQueueStatsResponse = await state.stats_cache.get(
        session.credential, client.admin.get_queue_stats
    )
    bars, peak = throughput_bars(list(stats.finished_per_minute))
    totals = {
        "queued": sum(kind.queued for kind in stats.kinds),
        "running": sum(kind.running for kind in stats.kinds),
        "succeeded": sum(kind.succeeded_last_hour for kind in stats.kinds),
        "failed": sum(kind.failed_last_hour for kind in stats.kinds),
        "cancelled": sum(kind.cancelled_last_hour for kind in stats.kinds),
    }
    context: dict[str, Any] = {
        "stats": stats,
        "totals": totals,
        "bars": bars,
        "peak": peak,
        "chart_width": CHART_WIDTH,
        "chart_height": CHART_HEIGHT,
        "bar_width": max(CHART_WIDTH / max(len(bars), 1) - 1, 1),
    }
    return render(request, "overview_admin.html", context, session)


async def _owner(request: Request, session: Session) -> Response:
    state = dashboard(request)
    client = state.gateway.client(session.credential)

    async def fetch() -> Any:
        stats = await client.stats()
        queued: list[jobs_pb2.Job] = []
        if stats.total.queued:
            page = await client.list_page(statuses=[jobs_pb2.JOB_STATUS_QUEUED], page_size=QUEUED_SAMPLE)
            queued = list(page.jobs)
        return owner_summary(stats, queued)

    summary = await state.owner_cache.get(session.credential, fetch)
    context = {"summary": summary, "statuses": STATUSES, "feed_rows": FEED_ROWS}
    return render(request, "overview_owner.html", context, session)


@signed_in
async def feed(request: Request, session: Session) -> Response:
    if session.is_admin:
        # Subscribe is JobService's: an admin credential owns no feed.
        return message(request, session, 404, "Not found", "The feed of events is an owner's.")
    gateway = dashboard(request).gateway
    return feed_events(request, lambda subscribe: gateway.subscribe(session.credential, subscribe))


ROUTES = [
    Route("/overview", overview, methods=["GET"], name="overview"),
    Route("/feed/events", feed, methods=["GET"], name="feed_events"),
]

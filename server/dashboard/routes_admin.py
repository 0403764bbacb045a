"""An admin's actions across owners: bulk cancel / retry by filter, always
counted with dry_run first, and pause / resume per kind."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from leasehold._server.dashboard.routes_jobs import filters_of, statuses_of
from leasehold._server.dashboard.sessions import Session
from leasehold._server.dashboard.web import checked_form, dashboard, message, render, signed_in


def _admins_only(request: Request, session: Session) -> Response:
    return message(request, session, 403, "Not allowed", "Only an admin can do this.")


@signed_in
async def bulk(request: Request, session: Session) -> Response:
    form = await checked_form(request, session.id)
    if not session.is_admin:
        return _admins_only(request, session)
    filters = filters_of(form, session)
    action = "retry" if form.get("action") == "retry" else "cancel"
    admin = dashboard(request).gateway.client(session.credential).admin
    call = admin.bulk_retry if action == "retry" else admin.bulk_cancel
    confirmed = form.get("confirm") == "1"
    matched = await call(
        statuses=statuses_of(filters),
        kind=filters["kind"],
        owner_id=filters["owner"],
        dry_run=not confirmed,
        # The confirmation page named the count and the filter: confirming it
        # is confirming a filter that matches every owner's jobs, too.
        confirm_all=confirmed,
    )
    shown = {name: value for name, value in filters.items() if value}
    back = f"{request.url_for('jobs')}?{urlencode(shown)}"
    if confirmed:
        done = "cancelled" if action == "cancel" else "retried"
        return message(request, session, 200, "Done", f"{matched} jobs {done}.", back)
    context = {"action": action, "matched": matched, "filters": filters, "back": back}
    return render(request, "bulk_confirm.html", context, session)


@signed_in
async def pause_kind(request: Request, session: Session) -> Response:
    return await _pause(request, session, pause=True)


@signed_in
async def resume_kind(request: Request, session: Session) -> Response:
    return await _pause(request, session, pause=False)


async def _pause(request: Request, session: Session, *, pause: bool) -> Response:
    form = await checked_form(request, session.id)
    if not session.is_admin:
        return _admins_only(request, session)
    kind = str(form.get("kind") or "")
    admin = dashboard(request).gateway.client(session.credential).admin
    await (admin.pause_kind(kind) if pause else admin.resume_kind(kind))
    dashboard(request).stats_cache.forget(session.credential)
    # Said here rather than by the overview, whose figures may be a second old.
    words = f"Claims of {kind} are paused: its queued jobs wait." if pause else f"Claims of {kind} go on."
    return message(
        request, session, 200, "Paused" if pause else "Resumed", words, str(request.url_for("overview"))
    )


ROUTES = [
    Route("/admin/bulk", bulk, methods=["POST"], name="bulk"),
    Route("/admin/pause", pause_kind, methods=["POST"], name="pause_kind"),
    Route("/admin/resume", resume_kind, methods=["POST"], name="resume_kind"),
]

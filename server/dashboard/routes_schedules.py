"""An owner's schedules: the list (paged as ListSchedules pages), and pause,
resume and trigger. Every call is ScheduleService with the session's own
credential, so an owner sees and acts on their own schedules only: another
owner's schedule id, typed into a form, is "not found" from the API.

ScheduleService takes only owner credentials (an admin's is refused as
UNAUTHENTICATED, which would end the session), so an admin is told so and
never sent there.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from leasehold._server.dashboard.sessions import Session
from leasehold._server.dashboard.web import (
    Link,
    Unseen,
    acting,
    checked_form,
    dashboard,
    message,
    render,
    signed_in,
)

PAGE_SIZE = 50
SCHEDULE_UNSEEN = Unseen("Schedule not found or not accessible.", "schedules")


def _owners_only(request: Request, session: Session) -> Response:
    return message(
        request,
        session,
        403,
        "Schedules are an owner's",
        "Schedules belong to owners, and ScheduleService takes only an owner's credential: "
        "sign in with an owner's token to see and act on that owner's schedules.",
    )


@signed_in
async def schedules(request: Request, session: Session) -> Response:
    if session.is_admin:
        return _owners_only(request, session)
    page_token = request.query_params.get("page", "")
    client = dashboard(request).gateway.client(session.credential)
    page = await client.list_schedules_page(page_token=page_token, page_size=PAGE_SIZE)
    base = str(request.url_for("schedules"))
    context = {
        "schedules": list(page.schedules),
        "page_token": page_token,
        "next_url": f"{base}?{urlencode({'page': page.next_page_token})}" if page.next_page_token else "",
        "first_url": base,
    }
    return render(request, "schedules.html", context, session)


def _back(request: Request, page_token: str) -> str:
    """The list page the form was on."""
    base = str(request.url_for("schedules"))
    return f"{base}?{urlencode({'page': page_token})}" if page_token else base


@signed_in
async def pause_schedule(request: Request, session: Session) -> Response:
    return await _pause(request, session, pause=True)


@signed_in
async def resume_schedule(request: Request, session: Session) -> Response:
    return await _pause(request, session, pause=False)


async def _pause(request: Request, session: Session, *, pause: bool) -> Response:
    form = await checked_form(request, session.id)
    if session.is_admin:
        return _owners_only(request, session)
    schedule_id = str(form.get("schedule_id") or "")
    back = _back(request, str(form.get("page") or ""))
    client = dashboard(request).gateway.client(session.credential)

    async def act() -> Response:
        await (client.pause_schedule(schedule_id) if pause else client.resume_schedule(schedule_id))
        return RedirectResponse(back, status_code=303)

    return await acting(request, act(), back, SCHEDULE_UNSEEN)


@signed_in
async def trigger_schedule(request: Request, session: Session) -> Response:
    form = await checked_form(request, session.id)
    if session.is_admin:
        return _owners_only(request, session)
    schedule_id = str(form.get("schedule_id") or "")
    back = _back(request, str(form.get("page") or ""))
    client = dashboard(request).gateway.client(session.credential)

    async def act() -> Response:
        fired = await client.trigger_schedule(schedule_id)
        # Said on a page of its own rather than by redirecting: a reload of
        # the list must never fire the schedule again.
        return message(
            request,
            session,
            200,
            "Triggered",
            f"Schedule {fired.schedule.schedule_id} fired once now and enqueued job {fired.job.id}.",
            back,
            Link(str(request.url_for("job", job_id=fired.job.id)), f"Open job {fired.job.id}"),
        )

    return await acting(request, act(), back, SCHEDULE_UNSEEN)


ROUTES = [
    Route("/schedules", schedules, methods=["GET"], name="schedules"),
    Route("/schedules/pause", pause_schedule, methods=["POST"], name="pause_schedule"),
    Route("/schedules/resume", resume_schedule, methods=["POST"], name="resume_schedule"),
    Route("/schedules/trigger", trigger_schedule, methods=["POST"], name="trigger_schedule"),
]

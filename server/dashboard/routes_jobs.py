"""The jobs table, the job page and its actions. Every read and action is an
API call with the session's own credential: another owner's job is NOT_FOUND
from the API, whether its id comes from a URL or a form field."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from leasehold._server.dashboard.actions import job_actions
from leasehold._server.dashboard.events import job_events
from leasehold._server.dashboard.graph import relatives, waiting_for
from leasehold._server.dashboard.sessions import Session
from leasehold._server.dashboard.stats import STATUSES, status_value
from leasehold._server.dashboard.web import acting, checked_form, dashboard, message, render, signed_in

PAGE_SIZE = 50


def filters_of(source: Any, session: Session) -> dict[str, str]:
    """status, kind, (for an admin) owner and (for an owner) parent, as given.
    An owner's `owner` is dropped: an owner lists their own jobs whatever they
    type. An admin's `parent` is dropped: AdminService lists by no parent, and
    a table that named a parent it did not filter by would mislead."""
    filters = {name: str(source.get(name) or "").strip() for name in ("status", "kind", "owner", "parent")}
    if session.is_admin:
        filters["parent"] = ""
    else:
        filters["owner"] = ""
    if filters["status"] and status_value(filters["status"]) is None:
        raise HTTPException(400, f"status: one of {', '.join(STATUSES)}")
    return filters


def statuses_of(filters: dict[str, str]) -> list[Any]:
    value = status_value(filters["status"]) if filters["status"] else None
    return [value] if value is not None else []


@signed_in
async def jobs(request: Request, session: Session) -> Response:
    filters = filters_of(request.query_params, session)
    page_token = request.query_params.get("page", "")
    client = dashboard(request).gateway.client(session.credential)
    common: dict[str, Any] = {
        "statuses": statuses_of(filters),
        "kind": filters["kind"],
        "page_token": page_token,
        "page_size": PAGE_SIZE,
    }
    if session.is_admin:
        page: Any = await client.admin.list_all_jobs_page(owner_id=filters["owner"], **common)
    else:
        # `parent`: the job page's way to every child past the ones it lists.
        page = await client.list_page(depends_on=filters["parent"], **common)
    shown = {name: value for name, value in filters.items() if value}
    base = str(request.url_for("jobs"))
    next_url = f"{base}?{urlencode({**shown, 'page': page.next_page_token})}" if page.next_page_token else ""
    first_url = f"{base}?{urlencode(shown)}" if shown else base
    # A job page's address cannot hold a "/": such a parent is shown unlinked.
    parent = filters["parent"]
    parent_url = str(request.url_for("job", job_id=parent)) if parent and "/" not in parent else ""
    context = {
        "jobs": list(page.jobs),
        "filters": filters,
        "parent_url": parent_url,
        "statuses": STATUSES,
        "page_token": page_token,
        "next_url": next_url,
        "first_url": first_url,
    }
    return render(request, "jobs.html", context, session)


@signed_in
async def job(request: Request, session: Session) -> Response:
    if session.is_admin:
        return _owners_only(request, session)
    client = dashboard(request).gateway.client(session.credential)
    found = await client.get(request.path_params["job_id"])
    context = {
        "job": found,
        "actions": job_actions(found),
        "waiting": waiting_for(found),
        "relatives": await relatives(client, found),
    }
    return render(request, "job.html", context, session)


def _owners_only(request: Request, session: Session) -> Response:
    """JobService (Get, WatchEvents, Cancel, Retry) is the owner's; an admin
    acts across owners by filter (AdminService has no per-job calls)."""
    return message(
        request,
        session,
        404,
        "Not found",
        "Job pages are for owners: an admin credential cannot read one job's events. "
        "Cancel or retry jobs by filter from the jobs table.",
        str(request.url_for("jobs")),
    )


@signed_in
async def cancel_job(request: Request, session: Session) -> Response:
    form = await checked_form(request, session.id)
    if session.is_admin:
        return _owners_only(request, session)
    job_id = str(form.get("job_id") or "")
    client = dashboard(request).gateway.client(session.credential)

    async def cancel() -> Response:
        cancelled = await client.cancel(job_id)
        return RedirectResponse(request.url_for("job", job_id=cancelled.id), status_code=303)

    return await acting(request, cancel(), _job_page(request, job_id))


@signed_in
async def retry_job(request: Request, session: Session) -> Response:
    form = await checked_form(request, session.id)
    if session.is_admin:
        return _owners_only(request, session)
    job_id = str(form.get("job_id") or "")
    client = dashboard(request).gateway.client(session.credential)

    async def retry() -> Response:
        retried = await client.retry(job_id)
        return RedirectResponse(request.url_for("job", job_id=retried.id), status_code=303)

    return await acting(request, retry(), _job_page(request, job_id))


def _job_page(request: Request, job_id: str) -> str:
    """Where a refused action leads back to: the job's page (the list when
    the form named no job, or nothing a job page's address can hold)."""
    if not job_id or "/" in job_id:
        return str(request.url_for("jobs"))
    return str(request.url_for("job", job_id=job_id))


@signed_in
async def events(request: Request, session: Session) -> Response:
    if session.is_admin:
        return _owners_only(request, session)
    client = dashboard(request).gateway.client(session.credential)
    return await job_events(request, client, request.path_params["job_id"])


ROUTES = [
    Route("/jobs", jobs, methods=["GET"], name="jobs"),
    Route("/jobs/cancel", cancel_job, methods=["POST"], name="cancel_job"),
    Route("/jobs/retry", retry_job, methods=["POST"], name="retry_job"),
    Route("/jobs/{job_id}", job, methods=["GET"], name="job"),
    Route("/jobs/{job_id}/events", events, methods=["GET"], name="job_events"),
]

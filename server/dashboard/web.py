"""What every page shares: the dashboard's state, the session cookie, the CSRF
check, rendering, and the one place API errors become pages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from leasehold._server.clock import Clock, SystemClock
from leasehold._server.dashboard.csrf import FIELD, CsrfTokens
from leasehold._server.dashboard.gateway import Gateway
from leasehold._server.dashboard.nav import entries_for
from leasehold._server.dashboard.sessions import LIFETIME, Session, SessionStore
from leasehold._server.dashboard.stats import PerCredentialCache

SESSION_COOKIE = "leasehold_session"
# Before sign-in: a random value the sign-in form's CSRF token is bound to.
PRESESSION_COOKIE = "leasehold_presession"
NOT_FOUND_WORDS = "Job not found or not accessible."


@dataclass
class Dashboard:
    sessions: SessionStore
    gateway: Gateway
    templates: Jinja2Templates
    secure_cookies: bool
    csrf: CsrfTokens = field(default_factory=CsrfTokens)
    # What "now" is on every page (relative times are worked out here, not in
    # the browser): the service's own injected clock.
    clock: Clock = field(default_factory=SystemClock)
    stats_cache: PerCredentialCache[Any] = field(default_factory=PerCredentialCache)
    owner_cache: PerCredentialCache[Any] = field(default_factory=PerCredentialCache)


def dashboard(request: Request) -> Dashboard:
    state: Dashboard = request.app.state.dashboard
    return state


def current_session(request: Request) -> Session | None:
    return dashboard(request).sessions.get(request.cookies.get(SESSION_COOKIE))


Endpoint = Callable[[Request, Session], Awaitable[Response]]


def signed_in(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint runs only for a live session; anyone else goes to sign-in."""

    async def guarded(request: Request) -> Response:
        session = current_session(request)
        if session is None:
            return RedirectResponse(request.url_for("sign_in_page"), status_code=303)
        return await endpoint(request, session)

    guarded.__name__ = endpoint.__name__
    return guarded


async def checked_form(request: Request, binding: str | None) -> FormData:
    """The POSTed form, once its CSRF token is shown to belong to `binding`
    (the session id, or the pre-session value before sign-in); 403 otherwise."""
    form = await request.form()
    if not dashboard(request).csrf.valid(binding, form.get(FIELD)):
        raise HTTPException(403, "The form's CSRF token is missing or not this session's.")
    return form


def render(
    request: Request,
    template: str,
    context: dict[str, Any],
    session: Session | None,
    status_code: int = 200,
) -> Response:
    state = dashboard(request)
    binding = session.id if session is not None else None
    context = {
        **context,
        "session": session,
        "csrf_token": state.csrf.token_for(binding) if binding else "",
        "nav": entries_for(session),
        "now": state.clock.now(),
    }
    return state.templates.TemplateResponse(request, template, context, status_code=status_code)


@dataclass(frozen=True)
class Link:
    url: str
    text: str


def message(
    request: Request,
    session: Session | None,
    status_code: int,
    heading: str,
    text: str,
    back: str = "",
    link: Link | None = None,
) -> Response:
    """A page of a few words, always with a way on: `back` when given, else
    the overview (or sign-in, signed out); `link` is one more, e.g. to a job
    an action made."""
    if not back:
        back = str(request.url_for("overview" if session is not None else "sign_in_page"))
    context = {"heading": heading, "message": text, "back": back, "link": link}
    return render(request, "message.html", context, session, status_code)


def set_session_cookie(response: Response, request: Request, session_id: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=int(LIFETIME.total_seconds()),
        httponly=True,
        samesite="strict",
        secure=dashboard(request).secure_cookies,
        path="/",
    )


async def api_error(request: Request, exc: Exception) -> Response:
    """An API refusal as a page (see `refusal_page`), reached when a route
    has no better way back to offer than the overview."""
    assert isinstance(exc, grpc.aio.AioRpcError)
    return refusal_page(request, exc)


@dataclass(frozen=True)
class Unseen:
    """What a page says of a job or schedule the caller cannot see, and the
    list it leads back to (the thing's own page would be no way back)."""

    words: str = NOT_FOUND_WORDS
    listing: str = "jobs"  # a route name


JOB_UNSEEN = Unseen()


def refusal_page(
    request: Request, exc: grpc.aio.AioRpcError, back: str = "", unseen: Unseen = JOB_UNSEEN
) -> Response:
    """An API refusal as a page, with the API's own words (escaped), except
    for what the caller cannot see: one fixed sentence, whether it is
    another owner's or does not exist. `back` is the page the action came
    from, so the reader is never left on a dead end."""
    session = current_session(request)
    code = exc.code()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        # The credential stopped working (revoked, expired): sign in again.
        if session is not None:
            dashboard(request).sessions.end(session.id)
        response = RedirectResponse(request.url_for("sign_in_page"), status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
        # JobService says PERMISSION_DENIED "job J not found or not accessible"
        # alike for another owner's job and for none (DESIGN §2).
        return message(request, session, 404, "Not found", unseen.words, str(request.url_for(unseen.listing)))
    status, heading = _PAGES.get(code, (502, "The service did not answer"))
    return message(request, session, status, heading, exc.details() or code.name, back)


async def acting(
    request: Request, action: Awaitable[Response], back: str, unseen: Unseen = JOB_UNSEEN
) -> Response:
    """`action`'s response, or its API refusal as a page leading `back`."""
    try:
        return await action
    except grpc.aio.AioRpcError as exc:
        return refusal_page(request, exc, back, unseen)


_PAGES = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "Not accepted"),
    grpc.StatusCode.FAILED_PRECONDITION: (409, "Not possible now"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "Too many requests"),
    grpc.StatusCode.UNAVAILABLE: (503, "The service is unavailable"),
}


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    heading = {403: "Refused", 404: "Not found", 405: "Not allowed"}.get(exc.status_code, "Error")
    return message(request, current_session(request), exc.status_code, heading, str(exc.detail))

"""Sign-in and sign-out."""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from leasehold._server.dashboard.gateway import SignInRefused
from leasehold._server.dashboard.web import (
    PRESESSION_COOKIE,
    SESSION_COOKIE,
    checked_form,
    current_session,
    dashboard,
    render,
    set_session_cookie,
)


async def home(request: Request) -> Response:
    target = "overview" if current_session(request) is not None else "sign_in_page"
    return RedirectResponse(request.url_for(target), status_code=303)


async def sign_in_page(request: Request, error: str = "", status_code: int = 200) -> Response:
    """The form, its CSRF token bound to a fresh pre-session cookie."""
    state = dashboard(request)
    presession = secrets.token_urlsafe(32)
    response = state.templates.TemplateResponse(
        request,
        "signin.html",
        {
            "session": None,
            "csrf_token": state.csrf.token_for(presession),
            "signs_in_with": state.gateway.signs_in_with,
            "error": error,
        },
        status_code=status_code,
    )
    response.set_cookie(
        PRESESSION_COOKIE,
        presession,
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=state.secure_cookies,
        path="/",
    )
    return response


async def sign_in(request: Request) -> Response:
    form = await checked_form(request, request.cookies.get(PRESESSION_COOKIE))
    secret = form.get("secret")
    state = dashboard(request)
    try:
        signed_in = await state.gateway.sign_in(secret if isinstance(secret, str) else "")
    except SignInRefused as refused:
        return await sign_in_page(request, str(refused), status_code=401)
    session = state.sessions.create(
        signed_in.credential, is_admin=signed_in.is_admin, owner_id=signed_in.owner_id
    )
    response = RedirectResponse(request.url_for("overview"), status_code=303)
    set_session_cookie(response, request, session.id)
    response.delete_cookie(PRESESSION_COOKIE, path="/")
    return response


async def sign_out(request: Request) -> Response:
    session = current_session(request)
    if session is not None:  # an expired session has nothing left to end
        await checked_form(request, session.id)
        dashboard(request).sessions.end(session.id)
    response = RedirectResponse(request.url_for("sign_in_page"), status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


ROUTES = [
    Route("/", home, name="home"),
    Route("/signin", sign_in_page, methods=["GET"], name="sign_in_page"),
    Route("/signin", sign_in, methods=["POST"], name="sign_in"),
    Route("/signout", sign_out, methods=["POST"], name="sign_out"),
]

__all__ = ["ROUTES", "render"]

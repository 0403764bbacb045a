"""The dashboard's ASGI application: routes, static files, the error pages and
the security headers every response carries."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from leasehold._server.dashboard import (
    routes_admin,
    routes_auth,
    routes_jobs,
    routes_overview,
    routes_schedules,
    routes_workers,
)
from leasehold._server.dashboard.web import Dashboard, api_error, http_error

STATIC_DIR = Path(__file__).parent / "static"

# Scripts, styles and everything else only from this origin, no inline script
# or style (the pages have none), no framing, forms post only here.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every HTTP response (pages, streams, errors)."""

    def __init__(self, app: ASGIApp, hsts: bool = False) -> None:
        self.app = app
        self.headers = (*SECURITY_HEADERS, HSTS) if hsts else SECURITY_HEADERS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in self.headers if name not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


# Under TLS: browsers that have seen the dashboard once use HTTPS for it for a year.
HSTS = (b"strict-transport-security", b"max-age=31536000")


def build_app(state: Dashboard, allowed_hosts: Sequence[str] = ("localhost",), hsts: bool = False) -> ASGIApp:
    app = Starlette(
        routes=[
            *routes_auth.ROUTES,
            *routes_overview.ROUTES,
            *routes_jobs.ROUTES,
            *routes_admin.ROUTES,
            *routes_schedules.ROUTES,
            *routes_workers.ROUTES,
            Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        ],
        exception_handlers={grpc.aio.AioRpcError: api_error, HTTPException: http_error},
    )
    app.state.dashboard = state
    return SecurityHeaders(TrustedHostMiddleware(app, allowed_hosts=list(allowed_hosts)), hsts=hsts)

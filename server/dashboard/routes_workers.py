"""An admin's view of the remote workers (AdminService.ListWorkers): who
claims or holds work on this server, which kinds, how many jobs each holds,
and when each was last heard from.

ListWorkers takes only an admin's credential, so an owner is told so here and
the API is never asked: an owner's refusal would otherwise read as a missing
job's, and no worker would be shown either way.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from leasehold._server.dashboard.sessions import Session
from leasehold._server.dashboard.web import dashboard, message, render, signed_in


def _admins_only(request: Request, session: Session) -> Response:
    return message(
        request,
        session,
        403,
        "Workers are an admin's",
        "Only an admin can see the remote workers: sign in with an admin's token.",
    )


@signed_in
async def workers(request: Request, session: Session) -> Response:
    if not session.is_admin:
        return _admins_only(request, session)
    listed = await dashboard(request).gateway.client(session.credential).admin.workers()
    context = {"workers": list(listed.workers), "truncated": listed.truncated}
    return render(request, "workers.html", context, session)


ROUTES = [Route("/workers", workers, methods=["GET"], name="workers")]

"""Signed-in sessions, kept in this process only: the browser holds a random
session id in an HttpOnly cookie, never the credential itself.

A restart signs everyone out, which is the price of never writing a
credential anywhere; sessions end after a quiet spell and in any case after
a fixed lifetime, so a stolen cookie is worth little for long.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from leasehold._server.clock import Clock

IDLE_LIMIT = timedelta(minutes=30)
LIFETIME = timedelta(hours=12)
# Enough for every operator at once; beyond it the least recently used session
# is dropped, so a flood of sign-ins cannot grow this process without bound.
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Credential:
    """What the dashboard presents to the API for a user: a bearer token
    (`--auth token|jwt`) or a trusted owner id (`--auth header`)."""

    kind: str  # "token" or "owner"
    value: str = field(repr=False)


@dataclass
class Session:
    id: str = field(repr=False)
    credential: Credential
    is_admin: bool
    created_at: datetime
    last_seen: datetime
    # The owner the credential stands for, learned at sign-in (None for an
    # admin, or when the service would not say).
    owner_id: str | None = None

    @property
    def role(self) -> str:
        return "admin" if self.is_admin else "owner"

    @property
    def who(self) -> str:
        """The user as the page header names them: `owner ann`, `admin`."""
        if self.is_admin or not self.owner_id:
            return self.role
        return f"owner {self.owner_id}"


class SessionStore:
    def __init__(
        self,
        clock: Clock,
        idle_limit: timedelta = IDLE_LIMIT,
        lifetime: timedelta = LIFETIME,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._clock = clock
        self._idle_limit = idle_limit
        self._lifetime = lifetime
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def create(self, credential: Credential, *, is_admin: bool, owner_id: str | None = None) -> Session:
        """A new session under a new random id (never one the browser sent
        before signing in: no session fixation)."""
        now = self._clock.now()
        session = Session(secrets.token_urlsafe(32), credential, is_admin, now, now, owner_id)
        self._sessions[session.id] = session
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with that id, its idle timer restarted; None when
        unknown or expired (an expired one is forgotten)."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock.now()
        if now - session.last_seen > self._idle_limit or now - session.created_at > self._lifetime:
            del self._sessions[session_id]
            return None
        session.last_seen = now
        self._sessions.move_to_end(session_id)
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)

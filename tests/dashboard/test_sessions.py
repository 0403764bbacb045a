"""The dashboard's sessions, CSRF tokens and stats cache, on their own: a
session ends after a quiet spell and after its lifetime, a CSRF token is good
only for the session it was made for, and many viewers asking at once cost
the API one call."""

from __future__ import annotations

import asyncio

from leasehold._server.clock import ManualClock
from leasehold._server.dashboard.csrf import CsrfTokens
from leasehold._server.dashboard.sessions import IDLE_LIMIT, LIFETIME, Credential, SessionStore
from leasehold._server.dashboard.stats import PerCredentialCache

TOKEN = Credential("token", "lh_secret-token")


def test_a_session_ends_after_a_quiet_spell(clock: ManualClock) -> None:
    store = SessionStore(clock)
    session = store.create(TOKEN, is_admin=False)
    clock.advance(IDLE_LIMIT.total_seconds() - 1)
    assert store.get(session.id) is session  # and the idle timer starts again
    clock.advance(IDLE_LIMIT.total_seconds() - 1)
    assert store.get(session.id) is session
    clock.advance(IDLE_LIMIT.total_seconds() + 1)
    assert store.get(session.id) is None
    assert len(store) == 0


def test_a_busy_session_still_ends_after_its_lifetime(clock: ManualClock) -> None:
    store = SessionStore(clock)
    session = store.create(TOKEN, is_admin=True)
    step = IDLE_LIMIT.total_seconds() / 2
    for _ in range(int(LIFETIME.total_seconds() / step) - 1):
        clock.advance(step)
        assert store.get(session.id) is session
    clock.advance(step + 1)
    assert store.get(session.id) is None


def test_each_sign_in_gets_a_new_random_id_and_sign_out_forgets_it(clock: ManualClock) -> None:
    store = SessionStore(clock)
    first, second = store.create(TOKEN, is_admin=False), store.create(TOKEN, is_admin=False)
    assert first.id != second.id and len(first.id) >= 40
    assert TOKEN.value not in repr(first)  # a session never prints its credential
    store.end(first.id)
    assert store.get(first.id) is None and store.get(second.id) is second
    assert store.get("") is None and store.get(None) is None


def test_the_least_recently_used_session_goes_when_the_store_is_full(clock: ManualClock) -> None:
    store = SessionStore(clock, max_sessions=2)
    old, kept = store.create(TOKEN, is_admin=False), store.create(TOKEN, is_admin=False)
    store.get(old.id)  # used: now the most recent
    newest = store.create(TOKEN, is_admin=False)
    assert [store.get(s.id) is not None for s in (old, kept, newest)] == [True, False, True]


def test_a_csrf_token_is_good_only_for_its_own_session() -> None:
    tokens = CsrfTokens()
    mine = tokens.token_for("session-a")
    assert tokens.valid("session-a", mine)
    assert not tokens.valid("session-b", mine)
    assert not tokens.valid("session-a", "")
    assert not tokens.valid("session-a", None)
    assert not tokens.valid(None, mine)
    assert not tokens.valid("session-a", mine[:-1] + ("0" if mine[-1] != "0" else "1"))
    assert not CsrfTokens().valid("session-a", mine)  # another process (a restart): another key


async def test_many_viewers_at_once_cost_one_call_per_credential_per_second() -> None:
    now = [100.0]
    cache: PerCredentialCache[int] = PerCredentialCache(seconds=1.0, monotonic=lambda: now[0])
    calls = 0
    release = asyncio.Event()

    async def fetch() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return calls

    viewers = [asyncio.create_task(cache.get(TOKEN, fetch)) for _ in range(50)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*viewers) == [1] * 50
    assert calls == 1
    now[0] += 0.5
    assert await cache.get(TOKEN, fetch) == 1
    assert await cache.get(Credential("token", "another"), fetch) == 2  # another credential asks itself
    now[0] += 1.0
    assert await cache.get(TOKEN, fetch) == 3
    assert calls == 3


async def test_a_failed_fetch_is_not_kept() -> None:
    cache: PerCredentialCache[int] = PerCredentialCache()
    outcomes = iter([RuntimeError("unavailable"), 7])

    async def fetch() -> int:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    try:
        await cache.get(TOKEN, fetch)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failure should reach the first caller")
    assert await cache.get(TOKEN, fetch) == 7

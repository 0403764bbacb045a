"""Multi-host PostgreSQL URLs: a primary and its standbys, named in one URL.

libpq tries the hosts in turn and keeps the first that takes writes
(`target_session_attrs=read-write`), so after a failover every connection
Leasehold makes (the writer, the readers, the listener) finds the new primary
by itself. Leasehold sets that attribute when the URL names several hosts, and
refuses a value that could leave it on a standby.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import make_url

from leasehold._server.clock import SystemClock
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.postgres import ChangeListener, check_url, listener_connect_args
from tests.conftest import Postgres
from tests.support import OWNER, make_repository


@pytest.mark.parametrize(
    ("url", "attrs"),
    [
        ("postgresql+psycopg://u@/db?host=a:5432&host=b:5433", "read-write"),
        ("postgresql+psycopg://u@a,b:5432/db", "read-write"),
        ("postgresql+psycopg://u@/db?host=a,b&port=5432,5433", "read-write"),
        ("postgresql+psycopg://u@/db?host=a&host=b&target_session_attrs=primary", "primary"),
        ("postgresql+psycopg://u@a:5432/db", None),  # one host: libpq's own default
    ],
)
def test_several_hosts_ask_for_a_writable_session(url: str, attrs: str | None) -> None:
    assert check_url(make_url(url)).query.get("target_session_attrs") == attrs


@pytest.mark.parametrize("attrs", ["any", "read-only", "standby", "prefer-standby"])
def test_a_session_attribute_that_may_reach_a_standby_is_refused_by_name(attrs: str) -> None:
    url = f"postgresql+psycopg://u@/db?host=a&host=b&target_session_attrs={attrs}"
    with pytest.raises(ValueError, match=f"database_url: target_session_attrs='{attrs}'.*read-write"):
        check_url(make_url(url))


async def test_a_url_whose_first_host_is_down_serves_from_the_next(postgres: Postgres) -> None:
    """Port 1 refuses at once, as a primary that is gone does: the writer, the
    readers and the listener all move on to the host that answers."""
    live = make_url(postgres.fresh_database_url())
    url = live.set(host=None, port=None).update_query_dict(
        {"host": ("127.0.0.1:1", f"{live.host}:{live.port}")}
    )
    text = url.render_as_string(hide_password=False)
    repository = await make_repository(text, SystemClock())
    try:
        job, _ = await repository.enqueue(NewJob(owner_id=OWNER, kind="example.echo", payload={}))
        assert (await repository.get(OWNER, job.id)).id == job.id
        claimed = await repository.claim("w", 1, 30)
        assert [c.job.id for c in claimed.jobs] == [job.id]
    finally:
        await repository.close()

    engines = create_engines(text)
    listener = ChangeListener(listener_connect_args(engines), ChangeHub(), origin="test")
    listening = asyncio.ensure_future(listener.run())
    try:
        await asyncio.wait_for(listener.listening.wait(), 15)
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await engines.dispose()

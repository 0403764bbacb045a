"""The fixtures of the tests that hold one replica inside its transaction
(`tests.replicas.holds`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.sql.rows import SqlRows
from tests.conftest import Postgres
from tests.replicas.holds import Hold, Replicas
from tests.support import make_repository


@pytest.fixture
def hold_after(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, Callable[..., bool]], Hold]]:
    """`hold_after(method, matches)`: a `Hold` on `SqlRows.method`; released at
    teardown whatever happened, so no writer thread is left stopped."""
    holds: list[Hold] = []

    def make(name: str, matches: Callable[..., bool]) -> Hold:
        hold = Hold(matches)
        original = getattr(SqlRows, name)

        def held(self: SqlRows, *args: Any, **kwargs: Any) -> Any:
            answer = original(self, *args, **kwargs)
            hold(self, *args)
            return answer

        monkeypatch.setattr(SqlRows, name, held)
        holds.append(hold)
        return hold

    yield make
    for hold in holds:
        hold.release()


@pytest.fixture
async def replicas(postgres: Postgres, clock: ManualClock) -> AsyncIterator[Replicas]:
    url = postgres.fresh_database_url()
    a = await make_repository(url, clock)
    b = await make_repository(url, clock)
    try:
        yield Replicas(a, b, url)
    finally:
        await a.close()
        await b.close()

"""Forgetting request ids stays an index walk: on 20,000 remembered ids, the
sweep's statement (the one it really sent, captured on the writer's
connection) finds the oldest through ix_request_ids_created_at and deletes
them by primary key, without scanning the table, on each database."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, insert

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.sql.tables import request_ids
from tests.storage.test_claim_plan import _migrated, _plan

KEYS = 20_000
START = datetime(2026, 1, 1, tzinfo=UTC)


def _full_scans(flavour: str, plan: list[str]) -> list[str]:
    if flavour == "sqlite":
        return [line for line in plan if re.match(r"SCAN request_ids\b", line) and " USING " not in line]
    return [line for line in plan if "Seq Scan on request_ids" in line]


async def test_forgetting_request_ids_walks_the_created_at_index(database_url: str) -> None:
    await _migrated(database_url)
    engines = create_engines(database_url)
    clock = ManualClock(START + timedelta(days=2))
    repository = SqlJobRepository(engines, clock)
    flavour = engines.dialect.name
    try:
        with engines.writer.begin() as conn:
            conn.execute(
                insert(request_ids),
                [
                    {
                        "owner_id": f"owner-{index % 200:04d}",
                        "request_id": f"req-{index}",
                        "method": "enqueue",
                        "fingerprint": "a" * 64,
                        "response": [],
                        "created_at": START + timedelta(seconds=index),
                    }
                    for index in range(KEYS)
                ],
            )
            if flavour == "postgresql":
                conn.exec_driver_sql("ANALYZE request_ids")
        sent: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
            if statement.lstrip().upper().startswith("DELETE FROM REQUEST_IDS"):
                sent.append((statement, parameters))

        event.listen(engines.writer, "before_cursor_execute", capture)
        try:
            forgotten = await repository.forget_request_ids(START + timedelta(seconds=KEYS // 2), 200)
        finally:
            event.remove(engines.writer, "before_cursor_execute", capture)

        assert forgotten == 200
        ((statement, parameters),) = sent
        with engines.writer.connect() as conn:
            plan = _plan(conn, flavour, statement, parameters)
        assert not _full_scans(flavour, plan), "\n".join([statement, *plan])
        assert any("ix_request_ids_created_at" in line for line in plan), plan
    finally:
        await repository.close()

"""The statements of repeatable worker writes (`worker_writes`) over the
`worker_writes` table: one lookup by primary key and one insert, each run in
the transaction of the write it belongs to. The primary key (job, token,
request key) is what keeps a second record, and so a second event, out even
when two replicas race with one request id: the loser's transaction fails and
its retry finds the winner's record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import bindparam, insert, select

from leasehold._server.jobs.records import Lease
from leasehold._server.jobs.sql.tables import worker_writes
from leasehold._server.jobs.worker_writes import WorkerWrite

FIND = select(worker_writes).where(
    worker_writes.c.job_id == bindparam("job_id"),
    worker_writes.c.lease_token == bindparam("token"),
    worker_writes.c.request_key == bindparam("request_key"),
)

INSERT = insert(worker_writes)


def from_row(row: Mapping[Any, Any]) -> WorkerWrite:
    return WorkerWrite(
        job_id=row["job_id"],
        lease_token=row["lease_token"],
        request_key=row["request_key"],
        write=row["write"],
        fingerprint=row["fingerprint"],
        answer=row["answer"],
        created_at=row["created_at"],
    )


def key(lease: Lease, request_key: str) -> dict[str, Any]:
    """`FIND`'s parameters: the record `lease`'s token left under `request_key`."""
    return {"job_id": lease.job_id, "token": lease.token, "request_key": request_key}

"""`leasehold jobs get` with parents it can no longer read: a parent retention
has deleted answers Get as an unknown id does, and is shown without a status
rather than ending the command; any other refusal still ends it."""

from __future__ import annotations

import argparse
import json
from typing import Any

import grpc
import pytest

from leasehold._server.cli import jobs
from leasehold._server.cli.output import Output
from leasehold.v1 import jobs_pb2


class Refused(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="refused")


class Relatives:
    """The two calls `jobs get` makes, answered from memory."""

    def __init__(self, known: dict[str, jobs_pb2.Job], refusal: grpc.StatusCode, children: int) -> None:
        self.known = known
        self.refusal = refusal
        self.children = children

    async def get(self, job_id: str) -> jobs_pb2.Job:
        if job_id not in self.known:
            raise Refused(self.refusal)
        return self.known[job_id]

    async def list_page(self, *, depends_on: str, page_size: int, **_: Any) -> jobs_pb2.ListResponse:
        made = [jobs_pb2.Job(id=f"job_c{i}", status=jobs_pb2.JOB_STATUS_QUEUED) for i in range(self.children)]
        return jobs_pb2.ListResponse(
            jobs=made[:page_size], next_page_token="more" if self.children > page_size else ""
        )


def child(*parents: str) -> jobs_pb2.Job:
    return jobs_pb2.Job(id="job_child", kind="example.echo", depends_on=parents, pending_dependencies=0)


async def test_a_deleted_parent_is_shown_without_a_status(capsys: pytest.CaptureFixture[str]) -> None:
    known = {
        "job_child": child("job_gone", "job_kept"),
        "job_kept": jobs_pb2.Job(id="job_kept", status=jobs_pb2.JOB_STATUS_SUCCEEDED),
    }
    client = Relatives(known, grpc.StatusCode.PERMISSION_DENIED, children=0)

    await jobs._get(client, argparse.Namespace(job_id="job_child"), Output("json"))  # type: ignore[arg-type]
    shown = json.loads(capsys.readouterr().out)
    await jobs._get(client, argparse.Namespace(job_id="job_child"), Output("table"))  # type: ignore[arg-type]
    table = capsys.readouterr().out

    assert shown["parents"] == [{"id": "job_gone"}, {"id": "job_kept", "status": "JOB_STATUS_SUCCEEDED"}]
    assert "job_gone  not found" in table and "job_kept  succeeded" in table


async def test_another_refusal_still_ends_the_command() -> None:
    client = Relatives({"job_child": child("job_away")}, grpc.StatusCode.UNAVAILABLE, children=0)

    with pytest.raises(grpc.aio.AioRpcError):
        await jobs._get(client, argparse.Namespace(job_id="job_child"), Output("json"))  # type: ignore[arg-type]


async def test_only_the_newest_hundred_children_are_shown_and_the_rest_announced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = Relatives({"job_child": child()}, grpc.StatusCode.PERMISSION_DENIED, children=150)

    await jobs._get(client, argparse.Namespace(job_id="job_child"), Output("json"))  # type: ignore[arg-type]
    shown = json.loads(capsys.readouterr().out)
    await jobs._get(client, argparse.Namespace(job_id="job_child"), Output("table"))  # type: ignore[arg-type]
    table = capsys.readouterr().out

    assert len(shown["children"]) == jobs.CHILDREN_SHOWN and shown["moreChildren"] is True
    assert "leasehold jobs list --depends-on job_child" in table


@pytest.mark.parametrize(
    ("status", "shown"),
    [
        (jobs_pb2.JOB_STATUS_QUEUED, "2 jobs, waiting for 1"),
        # Cancelled while it waited: it keeps its count, but waits for nothing.
        (jobs_pb2.JOB_STATUS_CANCELLED, "2 jobs"),
    ],
)
def test_only_a_queued_job_reads_as_waiting_for_its_parents(status: int, shown: str) -> None:
    job = jobs_pb2.Job(id="c", status=status, depends_on=["a", "b"], pending_dependencies=1)  # type: ignore[arg-type]
    assert jobs._dependencies_text(job) == shown

"""kill -9 between a parent's success and its children's start loses nothing
(DESIGN §18), on both engines, with real `leasehold serve` processes.

A parent's ending and its children's release are one commit: the success the
server acknowledges is already the release of every child, so a crash right
after the acknowledgement leaves every child due, never waiting on a parent
that has ended (and a crash before the commit leaves neither).

How: a first `serve` gets, over gRPC, a parent and CHILDREN children: the
parent and half the children as one graph in one BatchEnqueue (`ref` /
`depends_on_refs`), the other half by Enqueue naming the parent (`depends_on`).
The first process routes both kinds to remote workers and no worker but the
test is connected, so nothing runs on its own: the test claims the parent over
WorkerService, completes it, and SIGKILLs the server the moment Complete is
acknowledged (or, in the second variant, as soon as Complete is sent), so no
child can have started. The database is then read as the crash left it (on
PostgreSQL once the dead process's sessions have ended, so nothing it had sent
can still land): the parent succeeded and every child due
(`pending_dependencies` 0, `job.dependencies_met` logged), or, only when the
kill beat the acknowledgement, the parent still running and every child still
waiting; rows and logs consistent, no child run. A second `serve` on the same
database runs the children's kind itself (`test.record`, which writes one line
per execution) after the worker repeats its Complete there: every child runs
exactly once, attempt 1, and the parent's one attempt ends succeeded.
"""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path

import grpc
import pytest

from leasehold.v1 import jobs_pb2, worker_pb2, worker_pb2_grpc
from tests import database_reads
from tests.reliability.conftest import Figures, NewDatabase
from tests.reliability.process_helpers import (
    attempt_history,
    consistency_problems,
    event_logs,
    job_rows,
    storage_check,
    wait_for_other_sessions_to_end,
)
from tests.remote.support import AUTH, TOKEN
from tests.replicas.support import Track, status_counts
from tests.system.handlers_for_tests import RECORD_DIR_ENV
from tests.system.helpers import TEST_HANDLERS, Client, Leasehold, iter_records, struct, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CHILDREN = 200
PARENT_KIND = "remote.parent"
CHILD_KIND = "test.record"
CHILD_PAYLOAD = {"seconds": 0.005}


def child_request(**fields: object) -> jobs_pb2.EnqueueRequest:
    return jobs_pb2.EnqueueRequest(kind=CHILD_KIND, payload=struct(CHILD_PAYLOAD), **fields)  # type: ignore[arg-type]


def enqueue_graph(client: Client) -> tuple[str, list[str]]:
    """The parent and its children, over gRPC; every child answered waiting."""
    batch = [jobs_pb2.EnqueueRequest(kind=PARENT_KIND, ref="parent")]
    batch += [child_request(depends_on_refs=["parent"]) for _ in range(CHILDREN // 2)]
    response = client.stub.BatchEnqueue(
        jobs_pb2.BatchEnqueueRequest(requests=batch), metadata=client.metadata, timeout=30
    )
    parent = response.responses[0].job
    answered = [item.job for item in response.responses[1:]]
    calls = [
        client.stub.Enqueue.future(
            child_request(depends_on=[parent.id]), metadata=client.metadata, timeout=30
        )
        for _ in range(CHILDREN - len(answered))
    ]
    answered += [call.result().job for call in calls]
    assert all(
        (job.status, list(job.depends_on), job.pending_dependencies)
        == (jobs_pb2.JOB_STATUS_QUEUED, [parent.id], 1)
        for job in answered
    ), answered[0]
    assert len({job.id for job in answered}) == CHILDREN
    return parent.id, [job.id for job in answered]


def children_state(database_url: str, children: list[str]) -> collections.Counter[tuple[str, int]]:
    """How many children are in each (status, pending_dependencies)."""
    found = database_reads.rows(database_url, "SELECT id, status, pending_dependencies FROM jobs")
    wanted = set(children)
    return collections.Counter(
        (row["status"], int(row["pending_dependencies"])) for row in found if row["id"] in wanted
    )


def complete_request(parent: str, lease_token: str) -> worker_pb2.CompleteRequest:
    return worker_pb2.CompleteRequest(
        job_id=parent, lease_token=lease_token, result=struct({"parent": "done"})
    )


@pytest.mark.parametrize("kill", ["after-the-ack", "complete-in-flight"])
def test_kill9_around_a_parents_success_loses_none_of_its_children(
    new_database: NewDatabase, tmp_path: Path, processes: Track, figures: Figures, kill: str
) -> None:
    """`after-the-ack`: SIGKILL the moment Complete is acknowledged; the crash
    must have left the parent succeeded and every child released.
    `complete-in-flight`: SIGKILL straight after sending Complete, unanswered;
    the crash may have left either the success with every release, or neither
    (which one is kept in the figures; on this machine always neither: the
    kill lands before the server reads the call), never one without the other. Either way
    the worker then repeats its Complete, with the same lease token, to the
    restarted server, as a worker whose call failed does (protocol 2: a repeat
    of one that took effect answers as it did).

    Mutant M5 (the release as a write of its own, queued from the ending's
    unit of work and committed just after it: `_written` scheduling
    `_settle_children` in a new `_write` instead of calling it) fails
    `after-the-ack` on both engines, every run of three: the crash state has
    the parent succeeded and all its children waiting."""
    url = new_database(tmp_path)
    records = tmp_path / "records"
    records.mkdir()
    env = {"LEASEHOLD_WORKER_TOKEN": TOKEN, RECORD_DIR_ENV: str(records)}
    handlers = ("--handlers", *TEST_HANDLERS)
    first = processes(Leasehold.serve(url, *handlers, "--remote-kinds", PARENT_KIND, CHILD_KIND, env=env))
    port = first.start(timeout=60)
    with Client(port) as client:
        parent, children = enqueue_graph(client)
        worker = worker_pb2_grpc.WorkerServiceStub(client.channel)
        claim = worker.Claim(
            worker_pb2.ClaimRequest(worker_id="crash-test", kinds=[PARENT_KIND], max_jobs=1, wait_seconds=10),
            metadata=AUTH,
            timeout=30,
        )
        assert [claimed.job.id for claimed in claim.jobs] == [parent]
        lease_token = claim.jobs[0].lease_token
        if kill == "after-the-ack":
            done = worker.Complete(complete_request(parent, lease_token), metadata=AUTH, timeout=30)
            first.kill()  # the moment the success is acknowledged
            assert done.job.status == jobs_pb2.JOB_STATUS_SUCCEEDED
        else:
            call = worker.Complete.future(complete_request(parent, lease_token), metadata=AUTH, timeout=30)
            first.kill()
            with contextlib.suppress(grpc.RpcError):
                call.result()

    # The database as the crash left it (on PostgreSQL once nothing the dead
    # process sent can still land): the parent's success and every child's
    # release, or neither.
    wait_for_other_sessions_to_end(url)
    assert storage_check(url) == "ok"
    rows = job_rows(url)
    logs = event_logs(url)
    assert consistency_problems(rows, logs) == []
    ended = rows[parent]["status"] == "succeeded"
    if ended:
        assert children_state(url, children) == {("queued", 0): CHILDREN}
        released = {tuple(e.type for e in logs[child]) for child in children}
        assert released == {("job.queued", "job.dependencies_met")}
    else:
        assert kill == "complete-in-flight"
        assert rows[parent]["status"] == "running"
        assert children_state(url, children) == {("queued", 1): CHILDREN}
        assert {tuple(e.type for e in logs[child]) for child in children} == {("job.queued",)}
    assert list(iter_records(records)) == []  # no child had started
    figures(f"crash left the success committed ({kill})", ended)

    second = processes(
        Leasehold.serve(
            url,
            *handlers,
            "--remote-kinds",
            PARENT_KIND,
            "--concurrency",
            "8",
            "--poll-seconds",
            "0.05",
            env=env,
        )
    )
    with Client(second.start(timeout=60)) as client:
        worker = worker_pb2_grpc.WorkerServiceStub(client.channel)
        again = worker.Complete(complete_request(parent, lease_token), metadata=AUTH, timeout=30)
        assert again.job.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    wait_until(
        lambda: status_counts(url) == {"succeeded": CHILDREN + 1},
        timeout=60,
        what=f"the {CHILDREN} children to run",
        interval=0.1,
    )
    second.interrupt()
    assert second.returncode == 0, second.output[-3000:]

    # Every child ran exactly once, released once, and the parent once.
    runs = collections.Counter((record["job_id"], record["attempt"]) for record in iter_records(records))
    assert runs == {(child, 1): 1 for child in children}
    assert {record["outcome"] for record in iter_records(records)} == {"returned"}
    logs = event_logs(url)
    # (Each whole log, as attempt_history knows no `job.dependencies_met`.)
    assert {
        tuple((e.sequence, e.type, e.payload.get("attempt")) for e in logs[child]) for child in children
    } == {
        (
            (1, "job.queued", None),
            (2, "job.dependencies_met", None),
            (3, "job.started", 1),
            (4, "job.succeeded", None),
        )
    }
    assert [(a.number, a.closed_by) for a in attempt_history(parent, logs[parent])] == [(1, "job.succeeded")]

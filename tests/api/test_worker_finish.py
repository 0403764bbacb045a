"""WorkerService.Finish against a real server on each engine: many finishing
writes in one call, each fenced and answered on its own exactly as its single
call would be (a repeat included), and the call itself refused only for what
is wrong with the call."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2
from tests.api.helpers import enqueue, expect_invalid, get_job, struct
from tests.api.test_worker_service import AUTH, REMOTE_KIND, TOKEN, WorkerStub, running_remote_job
from tests.support import owner_metadata

Outcome = worker_pb2.Outcome


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {"remote_kinds": ("remote.*",), "worker_token": TOKEN, "cancel_grace_seconds": 30.0}


@pytest.fixture
def worker(channel: grpc.aio.Channel) -> WorkerStub:
    return WorkerStub(channel)


def _lease(claimed: worker_pb2.ClaimedJob) -> dict[str, str]:
    return {"job_id": claimed.job.id, "lease_token": claimed.lease_token}


async def _finish(worker: WorkerStub, *outcomes: worker_pb2.Outcome) -> list[worker_pb2.OutcomeResult]:
    response = await worker.Finish(worker_pb2.FinishRequest(outcomes=outcomes), metadata=AUTH)
    return list(response.results)


async def test_the_server_offers_finish(worker: WorkerStub) -> None:
    info = await worker.GetServerInfo(worker_pb2.GetServerInfoRequest(protocol_version=2), metadata=AUTH)
    assert "batch_finish" in info.features


async def test_each_kind_of_outcome_is_written_and_answered_in_order(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    done, failed, snoozed, stopped = [await running_remote_job(stub, worker) for _ in range(4)]
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=stopped.job.id), metadata=owner_metadata())
    outcomes = [
        Outcome(complete=worker_pb2.CompleteRequest(**_lease(done), result=struct({"rows": 3}))),
        Outcome(fail=worker_pb2.FailRequest(**_lease(failed), error_message="disk", non_retryable=True)),
        Outcome(snooze=worker_pb2.SnoozeRequest(**_lease(snoozed), delay_seconds=60)),
        Outcome(confirm_cancel=worker_pb2.ConfirmCancelRequest(**_lease(stopped))),
    ]
    results = await _finish(worker, *outcomes)

    assert [result.job_id for result in results] == [
        done.job.id,
        failed.job.id,
        snoozed.job.id,
        stopped.job.id,
    ]
    assert [result.job.status for result in results] == [
        jobs_pb2.JOB_STATUS_SUCCEEDED,
        jobs_pb2.JOB_STATUS_FAILED,
        jobs_pb2.JOB_STATUS_QUEUED,
        jobs_pb2.JOB_STATUS_CANCELLED,
    ]
    assert not any(result.lost or result.HasField("invalid") for result in results)
    assert dict((await get_job(stub, done.job.id)).result) == {"rows": 3}
    assert (await get_job(stub, failed.job.id)).error_message == "disk"

    # Sent again (the first answer lost): each answered as it was the first time,
    # nothing written twice.
    again = await _finish(worker, *outcomes)
    assert [result.job for result in again] == [result.job for result in results]


async def test_a_lost_and_an_invalid_outcome_leave_the_others_alone(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    first, second, third = [await running_remote_job(stub, worker) for _ in range(3)]
    results = await _finish(
        worker,
        Outcome(complete=worker_pb2.CompleteRequest(job_id=first.job.id, lease_token="not-the-token")),
        Outcome(fail=worker_pb2.FailRequest(**_lease(second), retry_after_seconds=-1)),
        Outcome(complete=worker_pb2.CompleteRequest(**_lease(third))),
    )

    lost, invalid, written = results
    assert lost.job_id == first.job.id and lost.lost and not lost.HasField("job")
    assert invalid.job_id == second.job.id and not invalid.HasField("job") and not invalid.lost
    assert invalid.invalid.field == "outcomes[1].fail.retry_after_seconds"
    assert written.job.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    # Neither the lost nor the refused outcome changed its job.
    assert (await get_job(stub, first.job.id)).status == jobs_pb2.JOB_STATUS_RUNNING
    assert (await get_job(stub, second.job.id)).status == jobs_pb2.JOB_STATUS_RUNNING


async def test_what_is_wrong_with_the_call_refuses_it(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    claimed = await running_remote_job(stub, worker)
    complete = Outcome(complete=worker_pb2.CompleteRequest(**_lease(claimed)))
    await expect_invalid(worker.Finish(worker_pb2.FinishRequest(), metadata=AUTH), "outcomes")
    await expect_invalid(
        worker.Finish(worker_pb2.FinishRequest(outcomes=[complete, Outcome()]), metadata=AUTH), "outcomes[1]"
    )
    await expect_invalid(
        worker.Finish(worker_pb2.FinishRequest(outcomes=[complete, complete]), metadata=AUTH),
        "outcomes[1].complete.job_id",
    )
    too_many = [
        Outcome(complete=worker_pb2.CompleteRequest(job_id=f"job-{index}", lease_token="t"))
        for index in range(1001)
    ]
    await expect_invalid(
        worker.Finish(worker_pb2.FinishRequest(outcomes=too_many), metadata=AUTH), "outcomes"
    )
    # Refused before any write: the job still runs.
    assert (await get_job(stub, claimed.job.id)).status == jobs_pb2.JOB_STATUS_RUNNING


async def test_finish_needs_the_worker_credential(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    claimed = await running_remote_job(stub, worker)
    request = worker_pb2.FinishRequest(
        outcomes=[Outcome(complete=worker_pb2.CompleteRequest(**_lease(claimed)))]
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await worker.Finish(request, metadata=(("authorization", "Bearer wrong-token-wrong-token"),))
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert (await get_job(stub, claimed.job.id)).status == jobs_pb2.JOB_STATUS_RUNNING
    assert REMOTE_KIND == claimed.job.kind
    await enqueue(stub, REMOTE_KIND)  # the server still serves after the refusal

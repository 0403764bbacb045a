"""The Worker's checkpoints against a fake WorkerService: `ctx.last_checkpoint`
is the claim's, and `await ctx.checkpoint(...)` returns only after a Heartbeat
carrying it was answered, so it is sent before the attempt's outcome; a server
that does not offer checkpoints is never sent one that it would drop."""

from __future__ import annotations

from leasehold.worker import HandlerRegistry, JobContext
from tests.remote_worker.fake_server import FakeWorkerService, fake_server, running_worker


def _registry(kind: str, handler: object) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(kind, handler)  # type: ignore[arg-type]
    return registry


async def resume(ctx: JobContext) -> dict[str, object]:
    start = (ctx.last_checkpoint or {}).get("next", 0)
    await ctx.checkpoint({"next": start + 1})
    return {"started_at": start}


async def test_a_checkpoint_is_sent_on_a_heartbeat_before_the_outcome_and_the_claims_is_read() -> None:
    service = FakeWorkerService(features=("checkpoints", "results", "snooze"))
    async with fake_server(service) as (service, address):
        async with running_worker(address, _registry("test.resume", resume)):
            job_id = await service.enqueue("test.resume", checkpoint={"next": 4})
            await service.until(lambda: bool(service.named("Complete")))

    carrying = [
        call
        for call in service.named("Heartbeat")
        if any(ref.HasField("checkpoint") for ref in call.request.leases)
    ]
    assert len(carrying) == 1
    (ref,) = carrying[0].request.leases  # one lease: sent at once, not with the batch
    assert (ref.job_id, dict(ref.checkpoint)) == (job_id, {"next": 5.0})
    assert service.calls.index(carrying[0]) < service.calls.index(service.named("Complete")[0])
    assert dict(service.named("Complete")[0].request.result) == {"started_at": 4.0}


async def test_a_server_without_checkpoints_fails_the_attempt_instead_of_dropping_it() -> None:
    async with fake_server() as (service, address):  # features: results, snooze
        async with running_worker(address, _registry("test.resume", resume)):
            await service.enqueue("test.resume")
            await service.until(lambda: bool(service.named("Fail")))

    assert not any(
        ref.HasField("checkpoint") for call in service.named("Heartbeat") for ref in call.request.leases
    )
    fail = service.named("Fail")[0].request
    assert fail.error_type == "CheckpointsUnsupported" and "checkpoints" in fail.error_message

"""The part of a drain that waits: running attempts, local and remote alike,
get the grace to finish, and the operator is told what is being waited for.

A drain that goes quiet for twenty seconds looks like a hang, so it says at
the start how many attempts it waits for and for how long at most, says again
every few seconds while it waits, and says at the end how it ended. A second
signal (`hurry`) ends the wait at once: local attempts are then handed back
to the queue, and remote ones keep their leases (their workers carry on and
report to whichever server answers next).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog

from leasehold._server.remote.attempts import RemoteAttempts
from leasehold._server.runtime.claim_loop import Runtime

log = structlog.get_logger("leasehold.app")

# How often a long drain says it is still waiting.
PROGRESS_SECONDS = 5.0


@dataclass(frozen=True)
class DrainOutcome:
    # "finished" (nothing left to wait for), "grace over" or "hurried".
    ended: str
    local_left: int
    remote_left: int


def _attempts(count: int) -> str:
    return f"{count} attempt{'' if count == 1 else 's'}"


async def let_attempts_finish(
    runtime: Runtime | None,
    remote: RemoteAttempts,
    grace_seconds: float,
    hurry: asyncio.Event,
    watch_streams: int,
) -> DrainOutcome:
    """Wait until no attempt runs, the grace is over, or `hurry` is set."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_seconds
    local, running_remote = _counts(runtime, remote)
    log.info(
        "server.draining",
        message=f"draining: {_attempts(local + running_remote)} running, up to {grace_seconds:g} s"
        + ("; send SIGINT or SIGTERM again to hand them back now" if local + running_remote else ""),
        attempts_running=local + running_remote,
        local_attempts=local,
        remote_attempts=running_remote,
        grace_seconds=grace_seconds,
        watch_streams=watch_streams,
    )
    next_progress = loop.time() + PROGRESS_SECONDS
    while True:
        remote.change.clear()  # before counting: an end after the count wakes the wait below
        local, running_remote = _counts(runtime, remote)
        if not local + running_remote:
            return DrainOutcome("finished", 0, 0)
        if hurry.is_set():
            return DrainOutcome("hurried", local, running_remote)
        now = loop.time()
        if now >= deadline:
            return DrainOutcome("grace over", local, running_remote)
        if now >= next_progress:
            log.info(
                "server.draining",
                message=f"still draining: {_attempts(local + running_remote)} running, "
                f"{deadline - now:.0f} s of grace left",
                attempts_running=local + running_remote,
                local_attempts=local,
                remote_attempts=running_remote,
            )
            next_progress = now + PROGRESS_SECONDS
        timeout = min(deadline, next_progress) - now
        expiry = remote.seconds_to_next_expiry()
        if expiry is not None:
            timeout = min(timeout, expiry)
        await _until_something_changes(runtime, remote, hurry, timeout)


def _counts(runtime: Runtime | None, remote: RemoteAttempts) -> tuple[int, int]:
    return (len(runtime.attempts) if runtime is not None else 0), remote.running()


async def _until_something_changes(
    runtime: Runtime | None, remote: RemoteAttempts, hurry: asyncio.Event, timeout: float
) -> None:
    waits: set[asyncio.Future[object]] = {
        asyncio.ensure_future(remote.change.wait()),
        asyncio.ensure_future(hurry.wait()),
    }
    local = set(runtime.attempts) if runtime is not None else set()
    try:
        await asyncio.wait(waits | local, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


def log_outcome(outcome: DrainOutcome, grace_seconds: float) -> None:
    """How the wait ended, once the local attempts left are handed back."""
    if outcome.ended == "finished":
        log.info("server.drained", message="drained: every attempt finished", ended=outcome.ended)
        return
    why = "a second signal" if outcome.ended == "hurried" else f"the {grace_seconds:g} s grace is over"
    parts = []
    if outcome.local_left:
        parts.append(f"handed {_attempts(outcome.local_left)} back to the queue")
    if outcome.remote_left:
        parts.append(
            f"{_attempts(outcome.remote_left)} of remote workers keep their leases "
            "and report to the next server"
        )
    log.warning(
        "server.drained",
        message=f"{why}: " + "; ".join(parts),
        ended=outcome.ended,
        handed_back=outcome.local_left,
        remote_attempts_left=outcome.remote_left,
    )

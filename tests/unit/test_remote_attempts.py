"""What a drain waits for on behalf of remote workers (server/remote/attempts.py):
an attempt counts from its Claim until its finishing write, a heartbeat that
finds the lease lost, or its lease running out unrenewed (a dead worker, or one
that now writes to another replica), on an injected clock."""

from __future__ import annotations

from datetime import timedelta

from leasehold._server.clock import ManualClock
from leasehold._server.remote.attempts import RemoteAttempts


def test_an_attempt_counts_until_its_finishing_write_and_wakes_the_drain() -> None:
    clock = ManualClock()
    attempts = RemoteAttempts(clock)
    attempts.claimed("job_a", "token-a", clock.now() + timedelta(seconds=30))
    attempts.claimed("job_b", "token-b", clock.now() + timedelta(seconds=30))
    attempts.change.clear()

    attempts.ended("job_a", "stale-token")  # an older attempt's write: not this one
    assert (attempts.running(), attempts.change.is_set()) == (2, False)
    attempts.ended("job_a", "token-a")
    assert (attempts.running(), attempts.change.is_set()) == (1, True)


def test_an_unrenewed_lease_stops_counting_when_it_runs_out_and_a_renewal_extends_it() -> None:
    clock = ManualClock()
    attempts = RemoteAttempts(clock)
    attempts.claimed("job_a", "token-a", clock.now() + timedelta(seconds=30))
    attempts.claimed("job_b", "token-b", clock.now() + timedelta(seconds=30))
    assert attempts.seconds_to_next_expiry() == 30

    clock.advance(20)
    attempts.renewed("job_b", "token-b", clock.now() + timedelta(seconds=30))
    attempts.renewed("job_a", "someone-else", clock.now() + timedelta(seconds=30))  # not its lease
    assert attempts.seconds_to_next_expiry() == 10

    clock.advance(10)
    assert attempts.running() == 1  # job_a's lease ran out; job_b was renewed
    clock.advance(30)
    assert (attempts.running(), attempts.seconds_to_next_expiry()) == (0, None)

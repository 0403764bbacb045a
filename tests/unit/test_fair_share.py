"""`steering.choose` on its own, over a queue held in a list: docs/steering.md's worked
example, and the rules that make the claim order exact."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from leasehold._server.jobs.steering import Head, HeadsWanted, Rate, Running, Steering, choose, refill


class ListView:
    """A `QueueView` over (job id, owner, kind, priority) rows, oldest first."""

    def __init__(
        self,
        rows: list[tuple[str, str, str, int]],
        running: dict[str, int] | None = None,
        heads_in_scan: bool = False,
    ) -> None:
        self.rows = rows
        # Whether the owner scan hands over each owner's oldest job (an engine
        # whose claims never run side by side), or only names the owners.
        self.heads_in_scan = heads_in_scan
        self.running_by_owner = running or {}
        self.head_calls = 0
        self.running_reads = 0

    def running(self) -> Running:
        self.running_reads += 1
        return Running(self.running_by_owner, {})

    def due_priorities(self) -> list[tuple[int, str | None]]:
        result = []
        for priority in sorted({p for _, _, _, p in self.rows}):
            owners = {owner for _, owner, _, p in self.rows if p == priority}
            result.append((priority, next(iter(owners)) if len(owners) == 1 else None))
        return result

    def owners_with_due(self, priority: int, after: str, count: int) -> list[tuple[str, Head | None]]:
        owners = sorted({owner for _, owner, _, p in self.rows if p == priority})
        found = ([o for o in owners if o > after] + [o for o in owners if o <= after])[:count]
        if not self.heads_in_scan:
            return [(owner, None) for owner in found]
        oldest = self._heads(priority, [HeadsWanted(owner, None, 1) for owner in found], frozenset())
        return [(owner, oldest[owner][0]) for owner in found]

    def heads(
        self, priority: int, wanted: Sequence[HeadsWanted], blocked_kinds: frozenset[str]
    ) -> dict[str, list[Head]]:
        self.head_calls += 1
        return self._heads(priority, wanted, blocked_kinds)

    def _heads(
        self, priority: int, wanted: Sequence[HeadsWanted], blocked_kinds: frozenset[str]
    ) -> dict[str, list[Head]]:
        found = {}
        for want in wanted:
            heads = [
                Head(job_id, kind, (place,))
                for place, (job_id, owner, kind, p) in enumerate(self.rows)
                if p == priority and owner == want.owner_id and kind not in blocked_kinds
            ]
            if want.after is not None:
                heads = [head for head in heads if head.position > want.after]  # type: ignore[operator]
            found[want.owner_id] = heads[: want.count]
        return found


def backlog(owner: str, count: int, kind: str = "k", priority: int = 3) -> list[tuple[str, str, str, int]]:
    return [(f"{owner}-{index}", owner, kind, priority) for index in range(count)]


def owners_of(job_ids: list[str]) -> list[str]:
    return [job_id.rsplit("-", 1)[0] for job_id in job_ids]


def test_the_worked_example_of_docs_steering() -> None:
    view = ListView(
        backlog("alice", 10) + backlog("bob", 10) + backlog("carol", 10),
        running={"alice": 6, "bob": 2, "carol": 2},
    )
    choice = choose(view, Steering(owner_weights={"carol": 2.0}), 4, "", {})

    assert owners_of(choice.job_ids) == ["carol", "carol", "bob", "carol"]
    assert choice.job_ids[:2] == ["carol-0", "carol-1"]  # oldest first within an owner


def test_ties_take_turns_from_after_the_last_owner_dealt() -> None:
    view = ListView(backlog("a", 5) + backlog("b", 5) + backlog("c", 5))
    first = choose(view, Steering(), 2, "", {})
    assert owners_of(first.job_ids) == ["a", "b"]
    assert first.cursor == "b"
    # Nothing is running in this view, so everyone ties at zero again: c is next in turn.
    assert owners_of(choose(view, Steering(), 4, first.cursor, {}).job_ids) == ["c", "a", "b", "c"]


def test_an_owner_found_beyond_the_first_scan_still_gets_its_turn() -> None:
    """The scan asks for as many owners as there are slots (plus those running):
    when the first ones have nothing claimable, the deal scans on."""
    view = ListView(backlog("a", 3, kind="full") + backlog("b", 3, kind="full") + backlog("c", 3))
    choice = choose(view, Steering(kind_limits={"full": 0}), 1, "", {})

    assert owners_of(choice.job_ids) == ["c"]


def test_rate_tokens_cap_a_claim_and_are_spent() -> None:
    view = ListView(backlog("a", 10, kind="r") + backlog("b", 10, kind="free"))
    choice = choose(view, Steering(kind_rates={"r": Rate(1.0, 3)}), 10, "", {"r": 2.5})

    assert Counter(owners_of(choice.job_ids)) == {"a": 2, "b": 8}
    assert choice.rate_spent == {"r": 2}


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    from datetime import UTC, datetime, timedelta

    from leasehold._server.jobs.steering import Bucket

    now = datetime(2026, 1, 1, tzinfo=UTC)
    rate = Rate(10.0, 5)
    assert refill(None, rate, now) == 5.0
    assert refill(Bucket(0.0, now), rate, now + timedelta(seconds=0.25)) == 2.5
    assert refill(Bucket(0.0, now), rate, now + timedelta(seconds=9)) == 5.0
    assert refill(Bucket(1.0, now), rate, now - timedelta(seconds=9)) == 1.0  # a clock stepping back


def test_a_lone_owner_s_claim_reads_its_heads_once_and_no_counts() -> None:
    view = ListView(backlog("a", 100))
    choice = choose(view, Steering(), 64, "", {})

    assert len(choice.job_ids) == 64
    assert view.head_calls == 1
    # Alone at its priority, with no limits, it needs no running counts at all.
    assert view.running_reads == 0
    two = ListView(backlog("a", 9) + backlog("b", 9))
    choose(two, Steering(), 4, "", {})
    assert two.running_reads == 1


def test_owners_that_share_a_claim_are_read_together() -> None:
    """Each of many owners is dealt a slot or two: their heads are read by a few
    questions, not one each."""
    rows = [row for index in range(100) for row in backlog(f"o{index:03d}", 5)]
    view = ListView(rows)
    choice = choose(view, Steering(), 200, "", {})

    assert Counter(owners_of(choice.job_ids)) == {f"o{index:03d}": 2 for index in range(100)}
    assert view.head_calls == 2
    # Where the scan hands over each owner's oldest job, only the second slots need a read.
    scanned = ListView(rows, heads_in_scan=True)
    again = choose(scanned, Steering(), 200, "", {})
    assert again.job_ids == choice.job_ids
    assert scanned.head_calls == 1
    one_each = ListView(rows, heads_in_scan=True)
    assert choose(one_each, Steering(), 64, "", {}).job_ids == choice.job_ids[:64]
    assert one_each.head_calls == 0

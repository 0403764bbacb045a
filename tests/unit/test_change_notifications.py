"""What one replica tells the others when a batch commits: a NOTIFY payload that
stays under PostgreSQL's size limit however many jobs a batch touched, and that
reads back as it was written."""

from __future__ import annotations

from leasehold._server.jobs.notifications import feed_key
from leasehold._server.jobs.sql.postgres import MAX_PAYLOAD_BYTES, notifier, parse, payloads


def test_a_small_batch_is_one_notification_that_reads_back() -> None:
    sent = list(payloads("origin1", True, ["job_a", "job_b"]))

    assert len(sent) == 1
    assert parse(sent[0]) == ("origin1", True, ["job_a", "job_b"], [])


def test_the_owners_whose_feeds_grew_travel_as_their_keys() -> None:
    sent = list(payloads("origin1", False, ["job_a"], [feed_key("alice"), feed_key("bob")]))

    assert parse(sent[0]) == ("origin1", False, ["job_a"], [feed_key("alice"), feed_key("bob")])
    # Bounded and unreadable, whatever the owner id holds.
    assert feed_key("alice") != feed_key("bob")
    assert all(len(feed_key(owner)) == 12 and ";" not in feed_key(owner) for owner in ("a;b", "x" * 500))


def test_work_without_events_is_still_announced() -> None:
    assert [parse(payload) for payload in payloads("o", True, [])] == [("o", True, [], [])]
    assert list(payloads("o", False, [])) == []


def test_a_large_batch_is_split_under_the_size_limit_and_loses_no_job() -> None:
    job_ids = [f"job_{index:032x}" for index in range(600)]  # more than a batch of 256 can touch

    sent = list(payloads("origin1", True, job_ids))

    assert len(sent) > 1
    assert all(len(payload.encode()) <= MAX_PAYLOAD_BYTES for payload in sent)
    decoded = [parse(payload) for payload in sent]
    assert all(item is not None and item[0] == "origin1" for item in decoded)
    assert [item[1] for item in decoded if item] == [True] + [False] * (len(sent) - 1)
    assert [job_id for item in decoded if item for job_id in item[2]] == job_ids


def test_a_foreign_payload_is_not_mistaken_for_ours() -> None:
    assert parse("hello") is None
    assert parse("a;2;job_x") is None


def test_the_notifications_travel_with_the_commit_as_quoted_literals() -> None:
    sent = notifier("origin1")(True, ["job_a", "it's"], [])

    assert sent == "NOTIFY \"leasehold_changes\", 'origin1;1;job_a,it''s';"
    assert notifier("origin1")(False, [], []) == ""

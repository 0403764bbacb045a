"""The JSON log on stderr names every attempt's outcome by job id and kind, holds
a failed attempt's traceback, and never carries a payload or handler output."""

from __future__ import annotations

import json

import pytest

from leasehold.v1 import jobs_pb2
from tests.system.helpers import EXIT_SECONDS, SECRET_MARKER, Client, Leasehold

pytestmark = pytest.mark.slow


def test_outcomes_are_logged_by_id_and_kind_without_payloads(database_url: str, processes) -> None:
    server = processes(
        Leasehold.serve(
            database_url,
            *("--concurrency", "4", "--poll-seconds", "0.05"),
            *("--handlers", "leasehold.examples", "tests.system.failing_handlers"),
        )
    )
    with Client(server.start()) as client:
        echo = client.enqueue("example.echo", {"note": SECRET_MARKER})
        # Fails once (retried after a 2 s backoff), then succeeds. Its error text
        # comes from the payload, so example.fail keeps it out of the log.
        flaky = client.enqueue(
            "example.fail", {"message": "flaky boom", "times": 1, "note": SECRET_MARKER}, max_attempts=2
        )
        doomed = client.enqueue(
            "example.fail", {"message": "doomed boom", "note": SECRET_MARKER}, max_attempts=1
        )
        holder = client.enqueue("test.fail-holding-payload", {"secret": SECRET_MARKER}, max_attempts=1)
        sleeper = client.enqueue("example.sleep", {"seconds": 30, "steps": 300, "note": SECRET_MARKER})
        client.events_until(sleeper.id, lambda event: event.type == "progress")
        client.cancel(sleeper.id)

        finals = {
            job.id: (client.all_events(job.id, timeout=30), client.get(job.id))
            for job in (echo, flaky, doomed, holder, sleeper)
        }
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0

    statuses = {job_id: job.status for job_id, (_, job) in finals.items()}
    assert statuses == {
        echo.id: jobs_pb2.JOB_STATUS_SUCCEEDED,
        flaky.id: jobs_pb2.JOB_STATUS_SUCCEEDED,
        doomed.id: jobs_pb2.JOB_STATUS_FAILED,
        holder.id: jobs_pb2.JOB_STATUS_FAILED,
        sleeper.id: jobs_pb2.JOB_STATUS_CANCELLED,
    }
    # The payload really did reach the handlers (so its absence from the log below
    # means something): the echo event carries it, the holder measured it.
    echo_events, _ = finals[echo.id]
    assert any(SECRET_MARKER in json.dumps(dict(e.payload)) for e in echo_events if e.type == "echo")
    held = finals[holder.id][1]
    assert (held.error_type, held.error_message) == (
        "LookupError",
        f"no document matches ({len(SECRET_MARKER)} characters)",
    )

    # Nothing the caller sent, and no handler output, ever reaches the log: not even from
    # a traceback, whose frames hold the payload in local variables.
    assert SECRET_MARKER not in server.output
    for record in server.records:
        assert "payload" not in record and "error" not in record, record

    def only(name: str, job: jobs_pb2.Job, **expected: object) -> list[dict[str, object]]:
        records = server.events_for(name, job.id)
        assert records, f"no {name} record for {job.kind} {job.id}"
        for record in records:
            assert record["kind"] == job.kind
            assert {key: record[key] for key in expected} == expected, record
        return records

    only("job.started", echo, attempt=1)
    only("job.completed", echo, attempt=1)

    assert [r["attempt"] for r in only("job.started", flaky)] == [1, 2]
    # A failure to be retried is a warning, a final one an error; both hold the traceback.
    (retried,) = only(
        "job.failed", flaky, attempt=1, final=False, error_class="RuntimeError", level="warning"
    )
    assert_traceback(retried, "RuntimeError (message redacted)")
    only("job.completed", flaky, attempt=2)

    (final,) = only("job.failed", doomed, attempt=1, final=True, error_class="RuntimeError", level="error")
    assert_traceback(final, "RuntimeError (message redacted)")
    assert not server.events_for("job.completed", doomed.id)
    assert finals[doomed.id][1].error_message == "doomed boom"  # its owner still reads it
    assert "boom" not in server.output

    # A handler's own words are logged with its traceback.
    (holding,) = only("job.failed", holder, final=True, error_class="LookupError", level="error")
    assert_traceback(holding, f"LookupError: {held.error_message}")
    assert "in fail_holding_payload" in str(holding["exception"])

    only("job.started", sleeper, attempt=1)
    only("job.cancelled", sleeper, attempt=1)
    assert not server.events_for("job.completed", sleeper.id)


def test_redact_error_messages_keeps_every_message_out_of_the_log(database_url: str, processes) -> None:
    server = processes(
        Leasehold.serve(
            database_url,
            "--redact-error-messages",
            *("--handlers", "leasehold.examples", "tests.system.failing_handlers"),
        )
    )
    with Client(server.start()) as client:
        holder = client.enqueue("test.fail-holding-payload", {"secret": SECRET_MARKER}, max_attempts=1)
        client.all_events(holder.id, timeout=30)
        held = client.get(holder.id)
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0

    # The job keeps the message, for its owner; the log has the type and frames only.
    assert held.error_message == f"no document matches ({len(SECRET_MARKER)} characters)"
    (record,) = server.events_for("job.failed", holder.id)
    assert record["error_class"] == "LookupError"
    assert_traceback(record, "LookupError (message redacted)")
    assert "in fail_holding_payload" in str(record["exception"])
    assert held.error_message not in server.output  # the source line of the raise is code, not data


def assert_traceback(record: dict[str, object], last_line: str) -> None:
    """The record carries the attempt's traceback, ending with the exception."""
    exception = str(record["exception"])
    assert exception.startswith("Traceback (most recent call last):"), record
    assert exception.rstrip().endswith(last_line), exception


def test_every_line_on_stderr_is_a_json_record(database_url: str, processes) -> None:
    server = processes(Leasehold.serve(database_url))  # a fresh file: the schema gets created
    server.start()
    assert server.interrupt() < EXIT_SECONDS and server.returncode == 0
    not_json = [line for line in server.raw_lines if line.strip() and not _is_json_object(line)]
    assert not_json == []


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False

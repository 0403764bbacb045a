"""`leasehold.client.to_dict`: what a caller reads from a job's result, an event's
payload or a schedule's job payload is what Python's `json` would give for the
JSON that was sent, integral numbers as `int`, and the command line's JSON output
is the same."""

from __future__ import annotations

import json

import pytest
from google.protobuf import struct_pb2

from leasehold._server.cli.output import Output, struct_text
from leasehold.client import to_dict
from leasehold.v1 import jobs_pb2, schedules_pb2


def struct(value: dict[str, object]) -> struct_pb2.Struct:
    made = struct_pb2.Struct()
    made.update(value)
    return made


def test_a_results_integral_numbers_are_int_and_the_rest_stay_as_they_were() -> None:
    job = jobs_pb2.Job(id="job_1", result=struct({"width": 1024, "ratio": 1.5, "ok": True, "none": None}))

    result = to_dict(job.result)

    assert result == {"width": 1024, "ratio": 1.5, "ok": True, "none": None}
    assert type(result["width"]) is int and type(result["ratio"]) is float and result["ok"] is True


def test_numbers_in_nested_lists_and_objects_are_converted_at_any_depth() -> None:
    payload = to_dict(struct({"sizes": [1, 2.5, [3, {"deep": 4}]], "box": {"inner": {"n": -5}}}))

    assert payload == {"sizes": [1, 2.5, [3, {"deep": 4}]], "box": {"inner": {"n": -5}}}
    sizes = payload["sizes"]
    assert [type(sizes[0]), type(sizes[1]), type(sizes[2][0]), type(sizes[2][1]["deep"])] == [
        int,
        float,
        int,
        int,
    ]
    assert type(payload["box"]["inner"]["n"]) is int


@pytest.mark.parametrize(
    ("sent", "received"),
    [
        (2**53, 2**53),
        (-(2**53), -(2**53)),
        # A Struct is a double: 2**53 + 1 has become 2**53 before it reaches the
        # client, and that value is exact, so it comes back an int, one less than sent.
        (2**53 + 1, 2**53),
        # Past 2**53 a whole-looking double may stand for several integers: a float.
        (2**53 + 2, float(2**53 + 2)),
        (1e300, 1e300),
    ],
)
def test_the_exact_integer_range_of_a_double_is_the_limit(sent: int, received: int | float) -> None:
    got = to_dict(struct({"n": sent}))["n"]

    assert got == received and type(got) is type(received)


def test_a_whole_message_keeps_messagetodict_keys_with_int_numbers_inside() -> None:
    event = jobs_pb2.JobEvent(job_id="job_1", sequence=2, type="job.started", payload=struct({"attempt": 1}))
    schedule = schedules_pb2.Schedule(
        schedule_id="nightly", job=schedules_pb2.ScheduleJob(kind="k", payload=struct({"limit": 50}))
    )

    assert to_dict(event) == {
        "jobId": "job_1",
        "sequence": "2",  # int64, as protobuf's JSON mapping writes it
        "type": "job.started",
        "payload": {"attempt": 1},
    }
    assert type(to_dict(event)["payload"]["attempt"]) is int
    assert type(to_dict(schedule)["job"]["payload"]["limit"]) is int
    assert type(to_dict(schedule.job.payload)["limit"]) is int


def test_a_non_finite_number_is_refused_rather_than_written_as_a_string() -> None:
    with pytest.raises(ValueError):
        to_dict(struct({"n": float("nan")}))


def test_the_command_lines_json_and_text_show_integers(capsys: pytest.CaptureFixture[str]) -> None:
    event = jobs_pb2.JobEvent(sequence=1, type="progress", payload=struct({"step": 2, "of": [3.0, 0.5]}))

    Output("json").message(event)
    text = struct_text(event, "payload")

    line = capsys.readouterr().out.strip()
    assert '"payload":{"of":[3,0.5],"step":2}' in line
    assert json.loads(line)["payload"] == {"step": 2, "of": [3, 0.5]}
    assert json.loads(text) == {"step": 2, "of": [3, 0.5]} and '"step":2' in text

"""A Struct carries doubles; what a handler gets is what JSON would give it:
integral numbers within +-2**53 as int, everything else unchanged."""

from __future__ import annotations

import math

import pytest
from google.protobuf import struct_pb2

from leasehold._server.api.convert import struct_to_dict
from leasehold.client._json import integral_numbers_as_int


def _roundtrip(value: dict[str, object]) -> dict[str, object]:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct_to_dict(struct)


@pytest.mark.parametrize(
    ("sent", "received"),
    [
        (3, 3),
        (0, 0),
        (-7, -7),
        (2**53, 2**53),
        (-(2**53), -(2**53)),
        (float(2**53 + 2), float(2**53 + 2)),  # past the exact range: left a float
        (float(-(2**60)), float(-(2**60))),
        (2.5, 2.5),
        (1e-300, 1e-300),
        (True, True),
        (False, False),
        ("3", "3"),
        (None, None),
    ],
)
def test_a_number_arrives_as_json_would_give_it(sent: object, received: object) -> None:
    got = _roundtrip({"v": sent})["v"]

    assert got == received and type(got) is type(received)


def test_lists_and_nested_objects_are_converted_at_any_depth() -> None:
    got = _roundtrip({"a": [1, 2.0, [3.0, {"b": 4.0}]], "c": {"d": {"e": 5.0}}})

    assert got == {"a": [1, 2, [3, {"b": 4}]], "c": {"d": {"e": 5}}}
    assert [type(x) for x in (got["a"][0], got["a"][1], got["a"][2][0], got["a"][2][1]["b"])] == [int] * 4  # type: ignore[index]
    assert type(got["c"]["d"]["e"]) is int  # type: ignore[index]


def test_non_finite_floats_are_left_alone() -> None:
    # struct_to_dict refuses them first (ValueError); the converter must not crash on them.
    assert math.isinf(integral_numbers_as_int(math.inf))
    assert math.isnan(integral_numbers_as_int(math.nan))
    with pytest.raises(ValueError):
        _roundtrip({"v": math.inf})

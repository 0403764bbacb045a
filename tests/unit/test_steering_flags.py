"""`serve`'s steering flags: what each accepts, and the one-line refusal naming
the flag for what it does not."""

from __future__ import annotations

import pytest

from leasehold._server.cli import main, serve, steering_flags
from leasehold._server.jobs.steering import Rate, Steering


def parsed(*args: str) -> Steering:
    return serve.settings_from(main.parser().parse_args(["serve", *args])).steering


def test_every_flag_reaches_the_settings() -> None:
    assert parsed(
        "--kind-limit",
        "pdf.render=4",
        "mail.send=1",
        "--owner-limit",
        "10",
        "--owner-weight",
        "acme=2.5",
        "tenant=with=equals=3",
        "--kind-rate",
        "pdf.render=10/s:5",
        "mail.send=0.5/s",
        "sms.send=2.5/s",
    ) == Steering(
        kind_limits={"pdf.render": 4, "mail.send": 1},
        owner_limit=10,
        owner_weights={"acme": 2.5, "tenant=with=equals": 3.0},
        kind_rates={"pdf.render": Rate(10.0, 5), "mail.send": Rate(0.5, 1), "sms.send": Rate(2.5, 3)},
    )


def test_nothing_set_is_no_steering() -> None:
    assert parsed() == Steering()


def test_the_environment_gives_them_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEHOLD_KIND_LIMIT", "pdf.render=4, mail.send=1")
    monkeypatch.setenv("LEASEHOLD_OWNER_LIMIT", "7")
    monkeypatch.setenv("LEASEHOLD_KIND_RATE", "pdf.render=3/s:9")

    assert parsed() == Steering(
        kind_limits={"pdf.render": 4, "mail.send": 1},
        owner_limit=7,
        kind_rates={"pdf.render": Rate(3.0, 9)},
    )


@pytest.mark.parametrize(
    ("kind_limits", "owner_limit", "weights", "rates", "words"),
    [
        (["pdf.render"], None, [], [], ["--kind-limit", "KIND=N"]),
        (["pdf.render=0"], None, [], [], ["--kind-limit", "between 1 and 100000"]),
        (["pdf.render=100001"], None, [], [], ["--kind-limit", "between 1 and 100000"]),
        (["pdf.render=2.5"], None, [], [], ["--kind-limit", "whole number"]),
        (["PDF=2"], None, [], [], ["--kind-limit", "kind"]),
        ([], "0", [], [], ["--owner-limit", "between 1"]),
        ([], "lots", [], [], ["--owner-limit", "whole number"]),
        ([], None, ["acme=0"], [], ["--owner-weight", "more than 0"]),
        ([], None, ["acme=nan"], [], ["--owner-weight", "more than 0"]),
        ([], None, ["acme=1e9"], [], ["--owner-weight", "at most 1000"]),
        ([], None, ["=2"], [], ["--owner-weight", "OWNER=W"]),
        ([], None, [], ["pdf.render=10"], ["--kind-rate", "R/s"]),
        ([], None, [], ["pdf.render=0/s"], ["--kind-rate", "more than 0"]),
        ([], None, [], ["pdf.render=1e9/s"], ["--kind-rate", "at most 100000"]),
        ([], None, [], ["pdf.render=10/s:0"], ["--kind-rate", "between 1"]),
        ([], None, [], ["pdf.render=10/s:x"], ["--kind-rate", "whole number"]),
    ],
)
def test_bad_values_are_refused_naming_the_flag(
    kind_limits: list[str], owner_limit: str | None, weights: list[str], rates: list[str], words: list[str]
) -> None:
    with pytest.raises(ValueError) as refused:
        steering_flags.steering(kind_limits, owner_limit, weights, rates)
    message = str(refused.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message

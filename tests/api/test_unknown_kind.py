"""An unknown kind is refused with the kinds this server does serve, local
kinds and remote patterns, at most ten of them (DESIGN §19): a typo shows its
fix in the error, and a server with many handlers still answers in one line."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from leasehold._server.jobs.routing import KindPatterns, ServedKinds
from leasehold._server.runtime.registry import HandlerRegistry
from tests.api.helpers import enqueue, expect_error


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {"remote_kinds": ("media.*", "pdf.render")}


async def test_enqueue_of_an_unknown_kind_names_the_served_kinds(stub, app) -> None:
    err = await expect_error(enqueue(stub, "example.ehco"), grpc.StatusCode.INVALID_ARGUMENT)
    assert err.details() == (
        "kind: no handler is registered for kind 'example.ehco'; this server serves example.echo, "
        "example.fail, example.sleep, test.gate, pdf.render, media.*"
    )


def _registry(count: int) -> HandlerRegistry:
    registry = HandlerRegistry()

    async def handler(ctx: Any) -> None:
        return None

    for index in range(count):
        registry.register(f"kind.{index:02d}", handler)
    return registry


def test_at_most_ten_kinds_are_named_and_the_rest_counted() -> None:
    served = ServedKinds(_registry(12), KindPatterns.parse(["media.*"]))
    assert served.refusal("nope") == (
        "no handler is registered for kind 'nope'; this server serves kind.00, kind.01, kind.02, "
        "kind.03, kind.04, kind.05, kind.06, kind.07, kind.08, kind.09 and 3 more"
    )


def test_a_server_that_serves_nothing_says_how_to_serve_something() -> None:
    served = ServedKinds(HandlerRegistry())
    assert not served("example.echo")
    assert served.refusal("example.echo").endswith(
        "this server serves no kind (start it with --handlers or --remote-kinds)"
    )

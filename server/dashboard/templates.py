"""The pages' Jinja2 environment. Autoescape is on for every template, and
no template marks data safe: a value from a job (its kind, resource, error,
payload) is always text, never markup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from google.protobuf import timestamp_pb2
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.templating import Jinja2Templates

from leasehold._server.dashboard.moments import moment
from leasehold._server.dashboard.stats import status_name
from leasehold.client import to_dict

TEMPLATE_DIR = Path(__file__).parent / "templates"


def timestamp(value: timestamp_pb2.Timestamp | None) -> str:
    """`2026-12-05 12:30:00 UTC`, or a dash when unset: the live event log's
    times, which a relative time would leave stale as the page stays open."""
    if value is None or (value.seconds == 0 and value.nanos == 0):
        return "—"
    return value.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty_json(message: Any) -> str:
    """A Struct as indented JSON text (escaped when shown, like every value)."""
    return json.dumps(to_dict(message), indent=2, sort_keys=True)


def templates() -> Jinja2Templates:
    environment = Environment(
        loader=FileSystemLoader(TEMPLATE_DIR),
        autoescape=select_autoescape(default=True, default_for_string=True),
        auto_reload=False,
    )
    environment.filters["status"] = status_name
    environment.filters["pretty_json"] = pretty_json
    environment.globals["moment"] = moment
    return Jinja2Templates(env=environment)

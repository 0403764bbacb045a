"""Command-line values to what the client takes: each mistake a UsageError that
names its flag."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from leasehold._server.cli.client_flags import UsageError
from leasehold.v1 import jobs_pb2

STATUSES = {
    name.removeprefix("JOB_STATUS_").lower(): value
    for name, value in jobs_pb2.JobStatus.items()
    if value != jobs_pb2.JOB_STATUS_UNSPECIFIED
}


def payload(text: str | None) -> dict[str, Any]:
    """`--payload JSON` or `--payload @FILE`: a JSON object."""
    if text is None:
        return {}
    source = "--payload"
    if text.startswith("@"):
        source = f"--payload {text}"
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise UsageError(f"{source}: cannot read the file: {exc.strerror}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source}: must be a JSON object, like '{{\"n\": 1}}'")
    return value


def resource(text: str | None) -> tuple[str, str]:
    """`--resource TYPE/ID` (the ID may itself contain slashes)."""
    if text is None:
        return "", ""
    kind, slash, key = text.partition("/")
    if not slash or not kind or not key:
        raise UsageError(f"--resource: TYPE/ID, like invoice/42, not {text!r}")
    return kind, key


def run_at(text: str | None) -> datetime | None:
    """`--run-at` in RFC 3339 with a zone (2026-05-01T09:00:00Z or ...+02:00)."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--run-at: not an RFC 3339 time: {text!r}") from None
    if moment.tzinfo is None:
        raise UsageError(f"--run-at: give a zone (Z or +HH:MM): {text!r}")
    return moment


def statuses(names: list[str] | None) -> list[jobs_pb2.JobStatus]:
    found = []
    for name in names or []:
        for part in name.split(","):
            key = part.strip().lower().removeprefix("job_status_")
            if key not in STATUSES:
                raise UsageError(f"--status: one of {', '.join(STATUSES)}, not {part!r}")
            found.append(STATUSES[key])
    return found


def status_name(value: jobs_pb2.JobStatus) -> str:
    return jobs_pb2.JobStatus.Name(value).removeprefix("JOB_STATUS_").lower()

"""Pure rules of the job state machine: limits, backoff and error text."""

from __future__ import annotations

import re
import secrets
import uuid
from datetime import datetime, timedelta

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_TIMEOUT_SECONDS = 900
MAX_ATTEMPTS_LIMIT = 100
TIMEOUT_SECONDS_LIMIT = 86_400
MAX_BACKOFF_SECONDS = 30
ERROR_TEXT_LIMIT = 1000
PAYLOAD_BYTES_LIMIT = 256 * 1024
KIND_PATTERN = re.compile(r"[a-z0-9._-]{1,128}")
EVENT_TYPE_LIMIT = 128
RESERVED_EVENT_PREFIX = "job."

TIMEOUT_ERROR_TEXT = "Background job timed out."
LEASE_EXPIRED_ERROR_TEXT = "Background job lease expired."


def backoff_seconds(attempt: int) -> int:
    """Seconds to wait before the attempt after `attempt` (1-based) may start."""
    return min(MAX_BACKOFF_SECONDS, 2 ** min(attempt, 16))


def next_retry_at(now: datetime, attempt: int) -> datetime:
    return now + timedelta(seconds=backoff_seconds(attempt))


def error_text(exc: BaseException) -> str:
    """What a failed attempt records: the exception's text, bounded.

    This is not a redactor: handlers must raise errors that are safe to show.
    """
    text = str(exc) or type(exc).__name__
    return text[:ERROR_TEXT_LIMIT]


def is_valid_kind(kind: str) -> bool:
    return KIND_PATTERN.fullmatch(kind) is not None


def new_job_id() -> str:
    return f"job_{uuid.uuid4().hex}"


def new_lease_token() -> str:
    return secrets.token_hex(16)

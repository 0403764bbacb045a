"""Fresh identifiers: job ids (opaque to callers) and lease tokens (secrets a
worker proves its attempt with)."""

from __future__ import annotations

import secrets
import uuid


def new_job_id() -> str:
    return f"job_{uuid.uuid4().hex}"


def new_lease_token() -> str:
    return secrets.token_hex(16)

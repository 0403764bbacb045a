"""Opaque List page tokens (AIP-158).

A token holds the keyset position and a digest of the filter it was made for,
signed with HMAC over the owner too. A token edited by hand, used with other
filters or by another owner is rejected; and since every query filters by owner
anyway, a token could never grant access even if it were accepted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import JobFilter, PageCursor

_FIELD = "page_token"


class PageTokenCodec:
    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("page_token_key: must be at least 16 bytes")
        self._key = key

    def encode(self, owner_id: str, job_filter: JobFilter, cursor: PageCursor) -> str:
        return self.encode_position(owner_id, _filter_digest(job_filter), cursor.job_id)

    def decode(self, owner_id: str, job_filter: JobFilter, token: str) -> PageCursor:
        return PageCursor(job_id=self.decode_position(owner_id, _filter_digest(job_filter), token))

    def encode_position(self, owner_id: str, scope: str, position: str) -> str:
        """A token for `position` (the last item of a page), bound to the owner
        and to `scope` (what the listing was: a filter's digest, or a name)."""
        body = json.dumps({"j": position, "f": scope}, separators=(",", ":")).encode()
        return f"{_b64(body)}.{_b64(self._sign(owner_id, body))}"

    def decode_position(self, owner_id: str, scope: str, token: str) -> str:
        try:
            body_part, signature_part = token.split(".")
            body, signature = _unb64(body_part), _unb64(signature_part)
        except ValueError:
            raise InvalidArgument(_FIELD, "not a token this service issued") from None
        if not hmac.compare_digest(signature, self._sign(owner_id, body)):
            raise InvalidArgument(_FIELD, "not a token this service issued")
        # Signed is not the same as readable: a token from another version of the
        # service sharing the key may carry a body this one does not understand.
        try:
            fields = json.loads(body)
            position, digest = fields["j"], fields["f"]
        except (ValueError, TypeError, KeyError):
            raise InvalidArgument(_FIELD, "not a token this service issued") from None
        if not isinstance(position, str) or not isinstance(digest, str):
            raise InvalidArgument(_FIELD, "not a token this service issued")
        if digest != scope:
            raise InvalidArgument(_FIELD, "was issued for different filters")
        return position

    def _sign(self, owner_id: str, body: bytes) -> bytes:
        return hmac.new(self._key, owner_id.encode() + b"\0" + body, hashlib.sha256).digest()


def _filter_digest(job_filter: JobFilter) -> str:
    """The filter a token binds. The children filter joins the list only when
    set, so a token issued before it existed still reads as the same filter."""
    fields: list[object] = [
        sorted(status.value for status in job_filter.statuses),
        job_filter.kind,
        job_filter.resource_type,
        job_filter.resource_id,
    ]
    if job_filter.depends_on:
        fields.append(job_filter.depends_on)
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not text:
        raise ValueError("empty")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except Exception as exc:
        raise ValueError("bad base64") from exc
    if _b64(data) != text:  # unused low bits of the last character were edited
        raise ValueError("not canonical base64")
    return data

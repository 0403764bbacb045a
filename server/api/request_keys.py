"""The request id of an idempotent call (AIP-155), with the fingerprint of its
request that tells a repeat from a key reused for something else.

The fingerprint is a SHA-256 of the request's deterministic serialization, the
whole request (its request_id too, which is the same in every repeat): a
repeat must be the same request, field for field. Protobuf's deterministic
form orders map entries (a payload's keys), so two encodings of one request
agree; only what the caller changed differs.
"""

from __future__ import annotations

import hashlib

from leasehold._server.api import validation
from leasehold._server.jobs.idempotency import Method, RequestKey
from leasehold.v1 import jobs_pb2

KeyedRequest = jobs_pb2.EnqueueRequest | jobs_pb2.BatchEnqueueRequest | jobs_pb2.RetryRequest


def request_key(owner_id: str, method: Method, request: KeyedRequest) -> RequestKey | None:
    """The call's key, or None when it sent no request_id (it is not idempotent);
    INVALID_ARGUMENT naming `request_id` when the id is malformed."""
    request_id = validation.request_id(request.request_id)
    if request_id is None:
        return None
    return RequestKey(owner_id, request_id, method, fingerprint(request))


def fingerprint(request: KeyedRequest) -> str:
    return hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()

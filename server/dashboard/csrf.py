"""Cross-site request forgery tokens: an HMAC of the session id under a key
this process draws at start, so a token is worth nothing in another session
(or after a restart) and nothing needs storing. Before sign-in the binding is
a random pre-session cookie, so the sign-in form is protected too."""

from __future__ import annotations

import hashlib
import hmac
import secrets

FIELD = "csrf_token"


class CsrfTokens:
    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def token_for(self, binding: str) -> str:
        return hmac.new(self._key, binding.encode(), hashlib.sha256).hexdigest()

    def valid(self, binding: str | None, token: object) -> bool:
        if not binding or not isinstance(token, str) or not token:
            return False
        return hmac.compare_digest(self.token_for(binding), token)

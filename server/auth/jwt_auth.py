"""`--auth jwt`: signed JWTs (PyJWT) from an identity provider.

The key file is an HS256 secret, one or more PEM public keys (RS256 for RSA,
ES256/ES384/ES512 by the EC curve), or a JWKS document; several keys allow a
rollover (a token's `kid` picks its key when both carry one). Each key accepts
only the algorithm its type implies, so `alg=none` and an HS256 token "signed"
with a public key are refused. `exp`, `iss` and `aud` are required, with 30 s
leeway for clock skew; `nbf` is honoured when present. The role claim (default
`leasehold_role`) is absent or `owner` (the owner id is then the owner claim,
default `sub`), `worker`, `worker:<kind pattern>,...` or `admin`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import structlog
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from leasehold._server.auth.authenticator import bearer
from leasehold._server.auth.identity import Identity, Role, parse_role, refusal

log = structlog.get_logger("leasehold.auth")

LEEWAY_SECONDS = 30
MIN_SECRET_BYTES = 32
DEFAULT_OWNER_CLAIM = "sub"
DEFAULT_ROLE_CLAIM = "leasehold_role"
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.+?-----END \1-----", re.DOTALL)
_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
# Wrong key for this token: another key of the set may still be the right one.
_TRY_NEXT_KEY = (jwt.InvalidSignatureError, jwt.InvalidAlgorithmError)


@dataclass(frozen=True)
class VerificationKey:
    key: Any
    algorithm: str
    kid: str | None = None


@dataclass(frozen=True)
class JwtSettings:
    key_file: str
    issuer: str
    audience: str
    owner_claim: str = DEFAULT_OWNER_CLAIM
    role_claim: str = DEFAULT_ROLE_CLAIM


def load_keys(path: str) -> list[VerificationKey]:
    """Raises ValueError naming jwt_key_file (never the key's bytes)."""
    try:
        data = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"jwt_key_file: cannot read {path}: {type(exc).__name__}") from None
    try:
        if data.startswith(b"{"):
            return _jwks(data)  # PyJWT refuses a set with no usable key
        if b"-----BEGIN" in data:
            blocks = [block.group(0) for block in _PEM_BLOCK.finditer(data)]
            # A file cut short mid-write (a rollover caught by SIGHUP) must be
            # refused, not read as fewer keys or none: reload keeps the old set.
            if len(blocks) != data.count(b"-----BEGIN"):
                raise ValueError("a PEM block is incomplete (no matching -----END line)")
            return [_pem_key(block) for block in blocks]
    except (ValueError, jwt.PyJWTError, TypeError) as exc:
        raise ValueError(f"jwt_key_file: {path}: {exc}") from None
    if len(data) < MIN_SECRET_BYTES:
        raise ValueError(f"jwt_key_file: {path}: an HS256 secret must be at least {MIN_SECRET_BYTES} bytes")
    return [VerificationKey(data, "HS256")]


def _jwks(data: bytes) -> list[VerificationKey]:
    try:
        document = json.loads(data)
    except json.JSONDecodeError:
        raise ValueError("not a JWKS document (JSON with a 'keys' list)") from None
    keys = jwt.PyJWKSet.from_dict(document).keys
    for index, key in enumerate(keys):
        # An `oct` key is a shared secret like a raw HS256 one, and as easy to
        # guess when short: the same floor applies.
        if isinstance(key.key, bytes) and len(key.key) < MIN_SECRET_BYTES:
            name = f"key {key.key_id!r}" if key.key_id else f"key {index}"
            raise ValueError(f"JWKS {name}: an HMAC (oct) key must be at least {MIN_SECRET_BYTES} bytes")
    return [VerificationKey(key.key, key.algorithm_name, key.key_id) for key in keys]


def _pem_key(block: bytes) -> VerificationKey:
    if b"PRIVATE KEY" in block.split(b"\n", 1)[0]:
        raise ValueError("holds a private key: give the identity provider's public key")
    public: Any = (
        x509.load_pem_x509_certificate(block).public_key()
        if block.startswith(b"-----BEGIN CERTIFICATE")
        else load_pem_public_key(block)
    )
    if isinstance(public, rsa.RSAPublicKey):
        return VerificationKey(public, "RS256")
    if isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name in _EC_ALGORITHMS:
        return VerificationKey(public, _EC_ALGORITHMS[public.curve.name])
    raise ValueError("a public key must be RSA or EC (P-256, P-384, P-521)")


class JwtAuthenticator:
    def __init__(self, settings: JwtSettings) -> None:
        self._settings = settings
        self._keys = load_keys(settings.key_file)

    def authenticate(self, context: grpc.aio.ServicerContext, wanted: Role) -> Identity:
        token = bearer(context.invocation_metadata() or ())
        if token is None:
            raise refusal(wanted, "missing authorization: Bearer <JWT> metadata")
        try:
            claims = self._verified(token)
        except jwt.PyJWTError as exc:
            # PyJWT's words name the failed check (expired, audience...), never the token.
            raise refusal(wanted, f"the JWT is not valid: {exc}") from None
        identity = self._identity(claims, wanted)
        # `exp` is required and checked by decode, so it is a number here.
        return dataclasses.replace(identity, expires_at=float(claims["exp"]) + LEEWAY_SECONDS)

    def _verified(self, token: str) -> dict[str, Any]:
        kid = jwt.get_unverified_header(token).get("kid")
        candidates = [key for key in self._keys if kid is None or key.kid is None or key.kid == kid]
        if not candidates:
            raise jwt.InvalidKeyError("no key has the token's kid")
        last: jwt.PyJWTError | None = None
        for key in candidates:
            try:
                return jwt.decode(
                    token,
                    key.key,
                    algorithms=[key.algorithm],
                    audience=self._settings.audience,
                    issuer=self._settings.issuer,
                    leeway=LEEWAY_SECONDS,
                    options={"require": ["exp", "iss", "aud"]},
                )
            except _TRY_NEXT_KEY as exc:
                last = exc
        assert last is not None
        raise last

    def _identity(self, claims: dict[str, Any], wanted: Role) -> Identity:
        role = claims.get(self._settings.role_claim, Role.OWNER.value)
        if role == Role.OWNER.value:
            owner = claims.get(self._settings.owner_claim)
            if not isinstance(owner, str):
                raise refusal(wanted, f"the JWT has no {self._settings.owner_claim} claim naming the owner")
            try:
                return Identity.owner(owner)
            except ValueError as exc:
                raise refusal(wanted, f"the JWT's {self._settings.owner_claim} claim: {exc}") from None
        if isinstance(role, str) and not role.startswith(f"{Role.OWNER.value}:"):
            try:
                return parse_role(role)
            except ValueError:
                pass
        raise refusal(
            wanted,
            f"the JWT's {self._settings.role_claim} claim must be absent, owner, worker, "
            "worker:<kind pattern>,... or admin",
        )

    def reload(self) -> None:
        """Re-read the key file (SIGHUP): how a new signing key joins the set
        before the identity provider starts using it."""
        try:
            keys = load_keys(self._settings.key_file)
        except ValueError as exc:
            log.error("auth.jwt_key_file_reload_failed", error=str(exc), kept=len(self._keys))
            return
        self._keys = keys
        log.info("auth.jwt_key_file_reloaded", keys=len(keys))

"""`--auth jwt`: PyJWT checks the signature with the algorithm the key's type
implies, `exp` (required, 30 s leeway), `nbf`, `iss` and `aud`; the owner and
role come from the configured claims."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import grpc
import pytest

from leasehold._server.auth.jwt_auth import load_keys
from leasehold._server.auth.settings import AuthSettings
from tests.api.helpers import error_reason, expect_error
from tests.auth.helpers import RPCS, case_ids, claim, code_of, connect, enqueue, list_jobs, serving
from tests.credentials import AUDIENCE, ISSUER, Signer, bearer, tampered, unsigned

OK = grpc.StatusCode.OK
UNAUTHENTICATED = NO = grpc.StatusCode.UNAUTHENTICATED


def _settings(key_file: Path, **extra: str) -> AuthSettings:
    return AuthSettings(
        mode="jwt", jwt_key_file=str(key_file), jwt_issuer=ISSUER, jwt_audience=AUDIENCE, **extra
    )


def _hs256_signed_with(secret: bytes, claims: dict[str, object]) -> str:
    """A token whose HS256 MAC uses `secret`: the key-confusion attack when the
    secret is the server's public key."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = part(b'{"alg":"HS256","typ":"JWT"}') + "." + part(json.dumps(claims).encode())
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + part(mac)


def _claims(**overrides: object) -> dict[str, object]:
    claims: dict[str, object] = {
        "sub": "alice",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": int(time.time()) + 300,
    }
    claims.update(overrides)
    return claims


# (case, token from the RS256 signer, service) -> status; the auth matrix's jwt rows.
CASES = [
    ("missing", lambda s: None, "JobService", UNAUTHENTICATED),
    ("not a JWT", lambda s: "not-a-jwt", "JobService", UNAUTHENTICATED),
    ("valid owner", lambda s: s.token(), "JobService", OK),
    ("valid owner", lambda s: s.token(), "ScheduleService", OK),
    ("valid owner", lambda s: s.token(), "WorkerService", UNAUTHENTICATED),
    ("expired 60 s ago", lambda s: s.token(exp=int(time.time()) - 60), "JobService", UNAUTHENTICATED),
    ("expired 10 s ago (leeway)", lambda s: s.token(exp=int(time.time()) - 10), "JobService", OK),
    ("no exp", lambda s: s.token(exp=None), "JobService", UNAUTHENTICATED),
    ("nbf in 60 s", lambda s: s.token(nbf=int(time.time()) + 60), "JobService", UNAUTHENTICATED),
    ("wrong issuer", lambda s: s.token(iss="https://evil.test"), "JobService", UNAUTHENTICATED),
    ("no issuer", lambda s: s.token(iss=None), "JobService", UNAUTHENTICATED),
    ("wrong audience", lambda s: s.token(aud="someone-else"), "JobService", UNAUTHENTICATED),
    ("tampered signature", lambda s: tampered(s.token()), "JobService", UNAUTHENTICATED),
    ("alg=none", lambda s: unsigned(_claims()), "JobService", UNAUTHENTICATED),
    (
        "HS256 with the public key",
        lambda s: _hs256_signed_with(s.public, _claims()),
        "JobService",
        UNAUTHENTICATED,
    ),
    (
        "another key",
        lambda s: Signer(s.key_file.parent, "RS256", kid="x").token(),
        "JobService",
        UNAUTHENTICATED,
    ),
    ("bad owner id", lambda s: s.token(sub="no spaces allowed"), "JobService", UNAUTHENTICATED),
    ("role worker", lambda s: s.token(leasehold_role="worker"), "WorkerService", OK),
    ("role worker", lambda s: s.token(leasehold_role="worker"), "JobService", UNAUTHENTICATED),
    ("role admin", lambda s: s.token(leasehold_role="admin"), "JobService", UNAUTHENTICATED),
    (
        "role owner:bob (not allowed)",
        lambda s: s.token(leasehold_role="owner:bob"),
        "JobService",
        UNAUTHENTICATED,
    ),
    ("role owner", lambda s: s.token(leasehold_role="owner"), "JobService", OK),
]


@pytest.mark.parametrize(("case", "token", "service", "expected"), CASES, ids=case_ids(CASES))
async def test_each_token_gets_its_status(tmp_path: Path, case, token, service, expected) -> None:
    signer = Signer(tmp_path, "RS256")
    async with serving(tmp_path, _settings(signer.key_file)) as app, connect(app) as channel:
        presented = token(signer)
        metadata = bearer(presented) if presented is not None else ()
        assert await code_of(RPCS[service](channel, metadata)) == expected, case


async def test_the_refusal_says_which_check_failed(tmp_path: Path) -> None:
    signer = Signer(tmp_path, "ES256")
    async with serving(tmp_path, _settings(signer.key_file)) as app, connect(app) as channel:
        expired = await expect_error(
            list_jobs(channel, bearer(signer.token(exp=int(time.time()) - 60))), UNAUTHENTICATED
        )
        assert expired.details() == "the JWT is not valid: Signature has expired"
        assert error_reason(expired) == "OWNER_UNRESOLVED"
        audience = await expect_error(list_jobs(channel, bearer(signer.token(aud="x"))), UNAUTHENTICATED)
        assert "Audience" in audience.details()


async def test_the_owner_and_role_come_from_the_configured_claims(tmp_path: Path) -> None:
    signer = Signer(tmp_path, "HS256")
    settings = _settings(signer.key_file, jwt_owner_claim="email", jwt_role_claim="scope")
    async with serving(tmp_path, settings) as app, connect(app) as channel:
        alice = bearer(signer.token(sub="ignored", email="alice@example.com"))
        job = (await enqueue(channel, alice, "media.resize")).job
        bob = bearer(signer.token(email="bob@example.com"))
        assert (await list_jobs(channel, bob)).jobs == []
        worker = bearer(signer.token(scope="worker:media.*"))
        claimed = await claim(channel, worker, "media.resize")
        assert [(c.job.id, c.owner_id) for c in claimed.jobs] == [(job.id, "alice@example.com")]
        denied = await code_of(claim(channel, worker, "report.x"))
        assert denied == grpc.StatusCode.PERMISSION_DENIED


async def test_a_jwks_with_two_keys_accepts_both_during_a_rollover(tmp_path: Path) -> None:
    old, new = Signer(tmp_path, "RS256", kid="2026-old"), Signer(tmp_path, "ES256", kid="2026-new")
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [old.jwk(), new.jwk()]}))
    async with serving(tmp_path, _settings(jwks)) as app, connect(app) as channel:
        assert await code_of(list_jobs(channel, bearer(old.token()))) == OK
        assert await code_of(list_jobs(channel, bearer(new.token()))) == OK
        stranger = Signer(tmp_path, "ES256", kid="2026-new")  # a known kid, another key
        assert await code_of(list_jobs(channel, bearer(stranger.token()))) == UNAUTHENTICATED


def test_several_pem_keys_each_pinned_to_their_algorithm(tmp_path: Path) -> None:
    rsa_signer, ec_signer = Signer(tmp_path, "RS256"), Signer(tmp_path, "ES256")
    both = tmp_path / "both.pem"
    both.write_bytes(rsa_signer.public + ec_signer.public)
    assert [key.algorithm for key in load_keys(str(both))] == ["RS256", "ES256"]


def test_a_key_file_cut_short_after_its_first_key_is_refused(tmp_path: Path) -> None:
    """What SIGHUP may catch mid-rollover: reading it as one key would drop the
    second without a word."""
    first, second = Signer(tmp_path, "RS256"), Signer(tmp_path, "ES256")
    path = tmp_path / "keys.pem"
    path.write_bytes(first.public + second.public[: len(second.public) // 2])
    with pytest.raises(ValueError, match="incomplete"):
        load_keys(str(path))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"short", "at least 32 bytes"),
        (b"-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n", "private key"),
        (b'{"keys": [{"kty": "nope"}]}', "jwt_key_file"),
        (b'{"keys": []}', "did not contain any keys"),
        (b"-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA", "incomplete"),
        # A one-byte `oct` key (k = base64url of "a"): a forged token would take a few guesses.
        (
            b'{"keys": [{"kty": "oct", "kid": "tiny", "alg": "HS256", "k": "YQ"}]}',
            "key 'tiny': an HMAC (oct)",
        ),
        (
            b'{"keys": [{"kty": "oct", "alg": "HS256", "k": "' + b"QUFB" * 10 + b'"}]}',
            "key 0: an HMAC (oct) key must be at least 32 bytes",
        ),
    ],
    ids=[
        "short secret",
        "private key",
        "bad jwks",
        "empty jwks",
        "cut-off pem",
        "1-byte oct key",
        "30-byte oct key",
    ],
)
def test_a_bad_key_file_is_refused_naming_it(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        load_keys(str(path))
    assert str(caught.value).startswith(f"jwt_key_file: {path}")
    assert words in str(caught.value)


def test_a_jwks_oct_key_of_32_bytes_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    secret = b"k" * 32
    encoded = base64.urlsafe_b64encode(secret).rstrip(b"=").decode()
    path.write_text(json.dumps({"keys": [{"kty": "oct", "kid": "ok", "alg": "HS256", "k": encoded}]}))
    [key] = load_keys(str(path))
    assert (key.key, key.algorithm) == (secret, "HS256")

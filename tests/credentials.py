"""Credentials for the auth tests, made at run time and never committed: a
throwaway certificate authority and the certificates it signs
(`cryptography`), token files, and signed JWTs (PyJWT)."""

from __future__ import annotations

import datetime
import ipaddress
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from leasehold._server.auth.tokens import new_token

ISSUER = "https://idp.test"
AUDIENCE = "leasehold"
HS256_SECRET = "an-hs256-secret-of-at-least-32-bytes!!"


def _pem_private(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pem_public(key: Any) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True)
class Issued:
    cert: bytes
    key: bytes
    cert_file: Path
    key_file: Path


class Authority:
    """A CA that signs server and client certificates into `directory`."""

    def __init__(self, directory: Path, name: str = "Leasehold Test CA") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )
        self.cert_file = directory / f"{name.replace(' ', '-')}.pem"
        self.cert_file.write_bytes(self.cert)

    def server(self, name: str = "server") -> Issued:
        return self._issue(
            name, [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )

    def client(self, common_name: str, *uris: str) -> Issued:
        return self._issue(common_name, [x509.UniformResourceIdentifier(uri) for uri in uris])

    def _issue(self, common_name: str, names: list[x509.GeneralName]) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        stem = self.directory / f"{common_name}-{x509.random_serial_number()}"
        issued = Issued(cert, _pem_private(key), stem.with_suffix(".crt"), stem.with_suffix(".key"))
        issued.cert_file.write_bytes(issued.cert)
        issued.key_file.write_bytes(issued.key)
        return issued


def token_file(path: Path, *roles: str) -> tuple[Path, list[str]]:
    """A token file granting each role one fresh token; the tokens, in order."""
    tokens, lines = [], ["# made by tests/credentials.py", ""]
    for role in roles:
        token, line = new_token(role)
        tokens.append(token)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    return path, tokens


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class Signer:
    """Signs JWTs with one key; `key_file` is what the server verifies with."""

    def __init__(self, directory: Path, algorithm: str = "RS256", kid: str | None = None) -> None:
        self.algorithm = algorithm
        self.kid = kid
        if algorithm == "HS256":
            self.key: Any = HS256_SECRET
            public = HS256_SECRET.encode()
        elif algorithm == "RS256":
            self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            public = pem_public(self.key)
        else:
            self.key = ec.generate_private_key(ec.SECP256R1())
            public = pem_public(self.key)
        self.public = public
        self.key_file = directory / f"jwt-{algorithm}-{kid or 'nokid'}.key"
        self.key_file.write_bytes(public)

    def token(self, **overrides: Any) -> str:
        """A valid owner token for `alice`, with claims overridden (None drops one)."""
        now = int(time.time())
        claims: dict[str, Any] = {"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300}
        claims.update(overrides)
        claims = {name: value for name, value in claims.items() if value is not None}
        headers = {"kid": self.kid} if self.kid else None
        return jwt.encode(claims, self.key, algorithm=self.algorithm, headers=headers)

    def jwk(self) -> dict[str, Any]:
        """The public key as a JWK (for a JWKS file)."""
        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        key = self.key.public_key() if self.algorithm != "HS256" else self.key
        jwk: dict[str, Any] = algorithm.to_jwk(key, as_dict=True)  # type: ignore[call-overload]
        jwk.update(alg=self.algorithm, use="sig")
        if self.kid:
            jwk["kid"] = self.kid
        return jwk


def unsigned(claims: dict[str, Any]) -> str:
    """An `alg=none` token."""
    return jwt.encode(claims, None, algorithm="none")  # type: ignore[arg-type]


def tampered(token: str) -> str:
    """The same token with one character of its payload changed."""
    header, payload, signature = token.split(".")
    flipped = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1]
    return ".".join((header, flipped, signature))

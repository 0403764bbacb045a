"""`serve --auth` and the TLS flags: one checked value, and what it builds (the
authenticator, the server's TLS credentials)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc

from leasehold._server.auth.authenticator import Authenticator
from leasehold._server.auth.header import HeaderAuthenticator
from leasehold._server.auth.jwt_auth import (
    DEFAULT_OWNER_CLAIM,
    DEFAULT_ROLE_CLAIM,
    JwtAuthenticator,
    JwtSettings,
)
from leasehold._server.auth.mtls import MtlsAuthenticator
from leasehold._server.auth.tokens import TokenAuthenticator

MODES = ("header", "token", "jwt", "mtls")


@dataclass(frozen=True)
class AuthSettings:
    mode: str = "header"
    token_file: str | None = None
    jwt_key_file: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_owner_claim: str = DEFAULT_OWNER_CLAIM
    jwt_role_claim: str = DEFAULT_ROLE_CLAIM
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    allow_insecure_header_auth: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"auth: one of {', '.join(MODES)}")
        if self.mode == "token" and not self.token_file:
            raise ValueError("token_file: --auth token needs --token-file FILE")
        if self.mode == "jwt":
            for name in ("jwt_key_file", "jwt_issuer", "jwt_audience"):
                if not getattr(self, name):
                    raise ValueError(f"{name}: --auth jwt needs --{name.replace('_', '-')}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert: --tls-cert and --tls-key go together")
        if self.mode == "mtls" and not (self.tls_client_ca and self.tls_cert):
            raise ValueError("tls_client_ca: --auth mtls needs --tls-client-ca, --tls-cert and --tls-key")
        if self.tls_client_ca and self.mode != "mtls":
            raise ValueError("tls_client_ca: only --auth mtls checks client certificates")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def check_listen(self, listen: str) -> None:
        """The secure default: a trusted owner header over plaintext only on
        loopback, where nobody else can send it."""
        host = listen.rpartition(":")[0]
        if self.mode != "header" or self.tls or self.allow_insecure_header_auth or is_loopback(host):
            return
        raise ValueError(
            f"listen: --auth header trusts the x-owner-id header, so without TLS it listens only on "
            f"loopback, not {host}: give --tls-cert and --tls-key, another --auth mode, or "
            "--allow-insecure-header-auth (only behind a gateway that authenticates callers)"
        )

    def exposes_credentials(self, listen: str) -> bool:
        """Whether bearer credentials (tokens, JWTs) would cross the network in
        the clear: worth a warning at start-up, not a refusal (a TLS-terminating
        proxy on the same host is a fair set-up)."""
        return self.mode in ("token", "jwt") and not self.tls and not is_loopback(listen.rpartition(":")[0])

    def authenticator(self, worker_token: str | None) -> Authenticator:
        """Raises ValueError naming the file or flag that cannot be used."""
        if self.mode == "token":
            assert self.token_file is not None
            return TokenAuthenticator(self.token_file)
        if self.mode == "jwt":
            assert self.jwt_key_file and self.jwt_issuer and self.jwt_audience
            return JwtAuthenticator(
                JwtSettings(
                    self.jwt_key_file,
                    self.jwt_issuer,
                    self.jwt_audience,
                    self.jwt_owner_claim,
                    self.jwt_role_claim,
                )
            )
        if self.mode == "mtls":
            return MtlsAuthenticator()
        return HeaderAuthenticator(worker_token)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """The listener's TLS, requiring a client certificate in mtls mode; None
        for plaintext."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        key = _read("tls_key", self.tls_key)
        cert = _read("tls_cert", self.tls_cert)
        client_ca = _read("tls_client_ca", self.tls_client_ca) if self.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def _read(name: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {path}: {type(exc).__name__}") from None

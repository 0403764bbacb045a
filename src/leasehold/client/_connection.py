"""The channel a client talks over, and the credentials it sends with every call.

Credentials travel as call metadata rather than channel credentials so that one
channel can serve many callers (the dashboard makes a light `Client` per signed-in
session on a shared channel) and so that a bearer token also works on a plaintext
loopback channel, as `serve --auth token` without TLS allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

# grpc's own reconnect backoff grows to 120 s after failed connects, and while it
# waits every call fails at once with UNAVAILABLE: our retry loop would then spend
# its whole deadline on a channel that is not even trying. Cap it near our own.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


@dataclass(frozen=True)
class Tls:
    """TLS settings: PEM bytes; `root_certificates` None means the system roots.
    A `certificate_chain` and `private_key` together are the client certificate
    (for `serve --auth mtls`)."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("Tls: certificate_chain and private_key go together")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )


def open_channel(target: str, tls: bool | Tls | None) -> grpc.aio.Channel:
    if tls is None or tls is False:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
    settings = Tls() if tls is True else tls
    return grpc.aio.secure_channel(target, settings.credentials(), options=CHANNEL_OPTIONS)


def credential_metadata(owner: str | None, token: str | None) -> tuple[tuple[str, str], ...]:
    """`x-owner-id` for `serve --auth header`, a bearer token for token and jwt."""
    metadata: list[tuple[str, str]] = []
    if owner is not None:
        metadata.append(("x-owner-id", owner))
    if token is not None:
        metadata.append(("authorization", f"Bearer {token}"))
    return tuple(metadata)

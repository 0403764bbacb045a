"""The dashboard's one way into the service: the public gRPC API, over one
shared channel to this process's own private listener, with a light
`leasehold.client.Client` per request carrying the signed-in user's own
credential. Whatever the API refuses, the dashboard cannot do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import grpc

from leasehold._server.dashboard.identity import OwnerOf
from leasehold._server.dashboard.sessions import Credential
from leasehold.client import Client
from leasehold.client._connection import credential_metadata
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

# A credential this service does not take (UNIMPLEMENTED: a server without
# AdminService).
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


# JobService.Subscribe's stream, as grpc.aio hands it over.
FeedCall: TypeAlias = grpc.aio.UnaryStreamCall[jobs_pb2.SubscribeRequest, jobs_pb2.SubscribeResponse]


# Longer than any token or JWT the API takes (its metadata limit is 64 KiB).
MAX_SECRET_CHARACTERS = 16 * 1024


class SignInRefused(Exception):
    """The credential opens neither JobService nor AdminService."""


@dataclass(frozen=True)
class SignedIn:
    """What sign-in learned: the credential, whether the API takes it as an
    admin's, and (for an owner) whose it is, to name them on every page."""

    credential: Credential
    is_admin: bool
    owner_id: str | None = None


def _no_owner(credential: Credential) -> str | None:
    return credential.value if credential.kind == "owner" else None


class Gateway:
    def __init__(self, target: str, auth_mode: str, owner_of: OwnerOf | None = None) -> None:
        """`owner_of` names the owner a credential stands for (the process's
        authenticator: no RPC says it); the default knows only header ids."""
        self._target = target
        self.auth_mode = auth_mode
        self._owner_of = owner_of or _no_owner
        self._channel: grpc.aio.Channel | None = None

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:  # made on the serving loop, at first use
            self._channel = grpc.aio.insecure_channel(self._target)
        return self._channel

    @property
    def signs_in_with(self) -> str:
        """What the sign-in form asks for in this auth mode."""
        return "owner" if self.auth_mode == "header" else "token"

    def client(self, credential: Credential) -> Client:
        """A client sharing the channel (closing it leaves the channel open)."""
        if credential.kind == "owner":
            return Client(self._target, owner=credential.value, channel=self.channel)
        return Client(self._target, token=credential.value, channel=self.channel)

    def subscribe(self, credential: Credential, request: jobs_pb2.SubscribeRequest) -> FeedCall:
        """JobService.Subscribe with the credential: the raw stream, which the
        caller reads and must cancel (the browser holds the resume point, so
        nothing here resumes by itself)."""
        owner, token = (credential.value, None) if credential.kind == "owner" else (None, credential.value)
        stub = jobs_pb2_grpc.JobServiceStub(self.channel)
        call: FeedCall = stub.Subscribe(request, metadata=credential_metadata(owner, token))
        return call

    async def sign_in(self, secret: str) -> SignedIn:
        """The credential for `secret` and whether it is an admin's, asked of
        the API itself: an owner can list its jobs, an admin can read the queue
        stats. Raises SignInRefused otherwise."""
        secret = secret.strip()
        if not secret:
            raise SignInRefused("enter a token" if self.signs_in_with == "token" else "enter an owner id")
        if len(secret) > MAX_SECRET_CHARACTERS:
            # Refused as any wrong token is (401), before it is sent: past gRPC's
            # metadata limit the API would answer RESOURCE_EXHAUSTED instead.
            raise SignInRefused("that token was not accepted")
        credential = Credential(self.signs_in_with, secret)
        client = self.client(credential)
        try:
            await client.list_page(page_size=1)
            return SignedIn(credential, is_admin=False, owner_id=self._owner_of(credential))
        except grpc.aio.AioRpcError as exc:
            if self.signs_in_with == "owner":
                raise SignInRefused("that owner id was not accepted") from None
            if exc.code() not in _REFUSED:
                raise
        try:
            await client.admin.get_queue_stats()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _REFUSED:
                raise
            raise SignInRefused("that token was not accepted") from None
        return SignedIn(credential, is_admin=True)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

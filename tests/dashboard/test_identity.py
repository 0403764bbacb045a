"""Naming the signed-in user: a token resolves to its owner exactly as the
service's own authenticator resolves it; an admin's or a bad one to none."""

from __future__ import annotations

from pathlib import Path

from leasehold._server.auth.tokens import TokenAuthenticator
from leasehold._server.dashboard.identity import owner_resolver
from leasehold._server.dashboard.sessions import Credential
from tests.credentials import token_file


def test_a_token_names_its_owner_and_nothing_else_does(tmp_path: Path) -> None:
    path, (ann, admin) = token_file(tmp_path / "tokens", "owner:ann", "admin")
    owner_of = owner_resolver(TokenAuthenticator(str(path)))
    assert owner_of(Credential("token", ann)) == "ann"
    assert owner_of(Credential("token", admin)) is None
    assert owner_of(Credential("token", "lh_not-a-token")) is None
    assert owner_of(Credential("owner", "bob")) == "bob"  # --auth header: the id itself

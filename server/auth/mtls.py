"""`--auth mtls`: the identity is the client certificate's, which the TLS
handshake has already checked against `--tls-client-ca`.

A certificate names its role with one URI SAN `leasehold:<role>`
(`leasehold:owner:alice`, `leasehold:worker`, `leasehold:worker:media.*`,
`leasehold:admin`); without one, it is an owner named by its subject CN. Other
URI SANs (SPIFFE ids, say) are ignored, and two `leasehold:` URIs are refused
rather than guessed between.
"""

from __future__ import annotations

import functools

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from leasehold._server.auth.identity import Identity, Role, parse_role, refusal

URI_SCHEME = "leasehold:"
PEM_CERT_PROPERTY = "x509_pem_cert"


class CertificateIdentityError(ValueError):
    """The certificate does not say who it is; the message says why."""


@functools.lru_cache(maxsize=1024)
def certificate_identity(pem: bytes) -> Identity:
    """Parsed once per distinct certificate: a connection's calls all carry it."""
    certificate = x509.load_pem_x509_certificate(pem)
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [uri for uri in names.get_values_for_type(x509.UniformResourceIdentifier)]
    except x509.ExtensionNotFound:
        uris = []
    roles = [uri[len(URI_SCHEME) :] for uri in uris if uri.startswith(URI_SCHEME)]
    if len(roles) > 1:
        raise CertificateIdentityError(f"the client certificate has more than one {URI_SCHEME} URI SAN")
    if roles:
        try:
            return parse_role(roles[0])
        except ValueError as exc:
            raise CertificateIdentityError(f"the client certificate's {URI_SCHEME} URI SAN: {exc}") from None
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(common_names) != 1 or not isinstance(common_names[0].value, str):
        raise CertificateIdentityError(
            f"the client certificate has neither a {URI_SCHEME} URI SAN nor one subject CN naming the owner"
        )
    try:
        return Identity.owner(common_names[0].value)
    except ValueError as exc:
        raise CertificateIdentityError(f"the client certificate's CN: {exc}") from None


class MtlsAuthenticator:
    def authenticate(self, context: grpc.aio.ServicerContext, wanted: Role) -> Identity:
        certificates = context.auth_context().get(PEM_CERT_PROPERTY) or []
        if not certificates:
            raise refusal(wanted, "no client certificate")
        try:
            return certificate_identity(certificates[0])
        except CertificateIdentityError as exc:
            raise refusal(wanted, str(exc)) from None

    def reload(self) -> None:
        """The client CA is read at start: a new CA needs a restart."""

"""Certificates for tests of TLS credentials (made at run time, never committed): a
self-signed CA, and client certificates it signs (what kind and kubeadm write into a
kubeconfig)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

KeyType = Literal["ec", "rsa"]


def self_signed_ca(
    common_name: str = "unit", key_type: KeyType = "ec", hours: float = 1
) -> tuple[str, str]:
    """A self-signed CA certificate and its key, PEM. ``key_type`` ``rsa`` writes the key as
    ``BEGIN RSA PRIVATE KEY``, as kind and kubeadm do."""
    key = _new_key(key_type)
    name = _name(common_name)
    cert = _certificate(name, name, key.public_key(), key, ca=True, hours=hours)
    return _cert_pem(cert), _key_pem(key)


def client_certificate(
    ca: tuple[str, str],
    common_name: str,
    organizations: Sequence[str] = (),
    key_type: KeyType = "ec",
    hours: float = 1,
) -> tuple[str, str]:
    """A client-auth certificate signed by ``ca`` (its certificate and key, PEM, as
    :func:`self_signed_ca` returns them) and its key, PEM. Kubernetes reads the user from
    the common name and the groups from the organizations."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca_cert = x509.load_pem_x509_certificate(ca[0].encode())
    ca_key = serialization.load_pem_private_key(ca[1].encode(), password=None)
    key = _new_key(key_type)
    subject = _name(common_name, organizations)
    cert = _certificate(subject, ca_cert.subject, key.public_key(), ca_key, ca=False, hours=hours)
    return _cert_pem(cert), _key_pem(key)


def _new_key(key_type: KeyType) -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organizations: Sequence[str] = ()) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _certificate(
    subject: Any, issuer: Any, public_key: Any, signer: Any, ca: bool, hours: float
) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = datetime.now(UTC)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca and isinstance(public_key, rsa.RSAPublicKey),
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=hours))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(usage, critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def _cert_pem(cert: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key: Any) -> str:
    """The key as kubeconfigs carry it: ``BEGIN RSA PRIVATE KEY`` / ``BEGIN EC PRIVATE KEY``."""
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()

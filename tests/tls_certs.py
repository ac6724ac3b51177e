"""Throwaway TLS material for the tests: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, and a second CA that signed none of them; and server
certificates with the names and validity period a test chooses."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class TlsFiles:
    """PEM files in one folder."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    node_cert: Path
    """A cluster node's: valid for serving (localhost, 127.0.0.1) and as a client."""
    node_key: Path


def make_tls_files(folder: Path) -> TlsFiles:
    """Write a fresh CA, the certificates it signs and an unrelated CA into ``folder``."""
    ca_key, ca_cert = _authority("Calor test CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, "calor test server", server=True)
    client_key, client_cert = _leaf(ca_key, ca_cert, "calor test client", server=False)
    node_key, node_cert = _leaf(ca_key, ca_cert, "calor test node", server=True, client=True)
    _, other_cert = _authority("Some other CA")
    files = TlsFiles(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_ca=folder / "other-ca.pem",
        node_cert=folder / "node.pem",
        node_key=folder / "node.key",
    )
    files.ca.write_bytes(_cert_pem(ca_cert))
    files.server_cert.write_bytes(_cert_pem(server_cert))
    files.server_key.write_bytes(_key_pem(server_key))
    files.client_cert.write_bytes(_cert_pem(client_cert))
    files.client_key.write_bytes(_key_pem(client_key))
    files.other_ca.write_bytes(_cert_pem(other_cert))
    files.node_cert.write_bytes(_cert_pem(node_cert))
    files.node_key.write_bytes(_key_pem(node_key))
    return files


@dataclass(frozen=True)
class ServerCert:
    """A server's certificate and key, and the CA that signed it (to trust)."""

    ca: Path
    cert: Path
    key: Path


def make_server_cert(
    folder: Path,
    names: Sequence[str] = ("localhost", "127.0.0.1"),
    *,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
) -> ServerCert:
    """Write a server certificate for ``names`` (DNS names or IP addresses), valid from
    ``not_before`` to ``not_after`` (default: an hour ago to two days on), and its own CA."""
    ca_key, ca_cert = _authority("Calor test CA")
    key, cert = _leaf(
        ca_key,
        ca_cert,
        "calor test server",
        server=True,
        names=names,
        period=(not_before, not_after),
    )
    files = ServerCert(
        ca=folder / "server-ca.pem", cert=folder / "server.pem", key=folder / "server.key"
    )
    files.ca.write_bytes(_cert_pem(ca_cert))
    files.cert.write_bytes(_cert_pem(cert))
    files.key.write_bytes(_key_pem(key))
    return files


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


_Period = tuple[datetime | None, datetime | None]


def _builder(
    subject: str, issuer: x509.Name, key: _Key, period: _Period = (None, None)
) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    not_before, not_after = period
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - timedelta(hours=1))
        .not_valid_after(not_after or now + timedelta(days=2))
    )


def _authority(common_name: str) -> tuple[_Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(common_name, _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: _Key,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    server: bool,
    client: bool = False,
    names: Sequence[str] = ("localhost", "127.0.0.1"),
    period: _Period = (None, None),
) -> tuple[_Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    purposes = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    if client or not server:
        purposes.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        _builder(common_name, ca_cert.subject, key, period)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(purposes), critical=False)
    )
    if server and names:
        alternatives = [_alternative(name) for name in names]
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _alternative(name: str) -> x509.GeneralName:
    """An IP address entry for an address, a DNS name entry otherwise."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: _Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )

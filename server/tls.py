"""The server's TLS credentials, read and checked from the files the config names."""

from __future__ import annotations

import ipaddress
import ssl
from datetime import UTC, datetime
from pathlib import Path

import grpc
from cryptography import x509

__all__ = ["TlsSetupError", "check_certificate", "peer_credentials", "server_credentials"]

_EVERY_ADDRESS = frozenset({"", "0.0.0.0", "::"})
"""Bind addresses that mean every interface: no one name a client dials."""


class TlsSetupError(OSError):
    """The TLS files cannot serve: missing, unreadable, not PEM, a key that does not
    match its certificate, or a certificate outside its validity period.

    An ``OSError``, as a port that is taken or a data dir that cannot be written, so that
    ``calor serve`` reports every start-up failure of that kind the same way.
    """


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> grpc.ServerCredentials | None:
    """The credentials of a TLS port, or None to serve plaintext (no files named).

    Args:
        cert: The PEM certificate chain the server presents (``--tls-cert``).
        key: Its unencrypted PEM private key (``--tls-key``).
        client_ca: PEM certificates of the CAs whose client certificates are accepted
            (``--tls-client-ca``); given, a client without such a certificate is refused.

    Raises:
        TlsSetupError: Only one of ``cert`` and ``key`` is given, ``client_ca`` comes
            without them, or a file cannot be read or used.
    """
    if cert is None and key is None:
        if client_ca is not None:
            raise TlsSetupError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise TlsSetupError("--tls-cert and --tls-key go together: give both or neither")
    cert_pem = _read_pem("--tls-cert", cert)
    key_pem = _read_pem("--tls-key", key)
    ca_pem = None if client_ca is None else _read_pem("--tls-client-ca", client_ca)
    _check(cert, key, client_ca)
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)],
        root_certificates=ca_pem,
        require_client_auth=ca_pem is not None,
    )


def peer_credentials(
    cert: Path | None, key: Path | None, peer_ca: Path | None
) -> grpc.ChannelCredentials | None:
    """How a node that serves TLS reaches the other nodes of its cluster (None: it serves
    plaintext, and so do they): over TLS, trusting ``peer_ca`` (the system's CAs if None)
    and presenting its own certificate, so that nodes requiring client certificates
    accept it (it must then be valid for client authentication too).

    Raises:
        TlsSetupError: A file cannot be read.
    """
    if cert is None or key is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=None if peer_ca is None else _read_pem("--peer-ca", peer_ca),
        private_key=_read_pem("--tls-key", key),
        certificate_chain=_read_pem("--tls-cert", cert),
    )


def _read_pem(flag: str, path: Path) -> bytes:
    """A file's bytes, which must hold PEM blocks."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TlsSetupError(f"{flag} {path}: {err.strerror or err}") from err
    if b"-----BEGIN " not in data:
        raise TlsSetupError(f"{flag} {path}: not a PEM file")
    return data


def _no_password() -> bytes:
    """Answers a key's password prompt, so an encrypted key fails instead of asking."""
    return b""


def _check(cert: Path, key: Path, client_ca: Path | None) -> None:
    """Load the files into an OpenSSL context, so bad ones fail now, not at each handshake.

    grpc reads its PEM bytes only when a client connects; the standard library's ``ssl``
    parses the same files at once and checks that the key belongs to the certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as err:
        raise TlsSetupError(
            f"--tls-cert {cert} / --tls-key {key}: not a certificate and its unencrypted "
            f"private key ({err.reason or err})"
        ) from err
    if client_ca is None:
        return
    try:
        context.load_verify_locations(cafile=client_ca)
    except ssl.SSLError as err:
        raise TlsSetupError(
            f"--tls-client-ca {client_ca}: no CA certificates ({err.reason or err})"
        ) from err


def check_certificate(cert: Path, host: str, now: datetime) -> str | None:
    """Check the certificate chain a server is about to present on ``host``.

    A certificate outside its validity period at ``now`` would fail every handshake, so
    it stops the server. Names that do not cover ``host`` only make a warning: clients
    may dial another name for the same address, or reach the server through a proxy.

    Args:
        cert: The PEM certificate chain (``--tls-cert``), the server's own first.
        host: The address the server binds (``--host``); one that binds every interface
            (``0.0.0.0``, ``::``) names no host to check.
        now: The server's time.

    Returns:
        Why the certificate's names do not cover ``host``, or None when they do.

    Raises:
        TlsSetupError: The file holds no certificate, or one in the chain has expired or
            is not valid yet.
    """
    try:
        chain = x509.load_pem_x509_certificates(cert.read_bytes())
    except (OSError, ValueError) as err:
        raise TlsSetupError(f"--tls-cert {cert}: no certificate ({err})") from err
    for place, certificate in enumerate(chain):
        which = (
            "the certificate"
            if place == 0
            else f"certificate {place + 1} of the chain ({certificate.subject.rfc4514_string()})"
        )
        if now > certificate.not_valid_after_utc:
            until = _when(certificate.not_valid_after_utc)
            raise TlsSetupError(f"--tls-cert {cert}: {which} expired on {until}")
        if now < certificate.not_valid_before_utc:
            since = _when(certificate.not_valid_before_utc)
            raise TlsSetupError(f"--tls-cert {cert}: {which} is not valid until {since}")
    names = _names(chain[0])
    bound = host.strip("[]")
    if bound in _EVERY_ADDRESS or _covers(names, bound):
        return None
    named = ", ".join(names) if names else "no names (no subject alternative names)"
    return (
        f"--tls-cert {cert} names {named}, not --host {host}: clients that dial {host} "
        "will refuse the handshake (fine if they dial one of those names, or a proxy does)"
    )


def _when(moment: datetime) -> str:
    """A moment as the messages give it: ISO 8601, UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _names(certificate: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses of a certificate's subject alternative names."""
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    names = extension.value
    dns: list[str] = names.get_values_for_type(x509.DNSName)
    addresses = [str(a) for a in names.get_values_for_type(x509.IPAddress)]
    return [*dns, *addresses]


def _covers(names: list[str], host: str) -> bool:
    """Whether a certificate with these names is valid for ``host``: the same IP address,
    or a DNS name equal to it or a wildcard over its first label (``*.example.com``)."""
    address = _address(host)
    if address is not None:
        return any(_address(name) == address for name in names)
    wanted = host.lower().rstrip(".")
    return any(_dns_match(name.lower(), wanted) for name in names)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address, or None for a name."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _dns_match(pattern: str, host: str) -> bool:
    """Whether a DNS name entry (``*.`` a wildcard over one label) matches ``host``."""
    if not pattern.startswith("*."):
        return pattern == host
    first, dot, rest = host.partition(".")
    return bool(first) and bool(dot) and rest == pattern[2:]

"""The server's TLS credentials, read and checked from the files the config names."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

__all__ = ["TlsSetupError", "peer_credentials", "server_credentials"]


class TlsSetupError(OSError):
    """The TLS files cannot serve: missing, unreadable, not PEM, or a key that does not
    match its certificate.

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

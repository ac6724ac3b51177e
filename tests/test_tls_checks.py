"""The certificate checked when the server starts: one outside its validity period stops
it with the reason; names that do not cover the bound host make a warning."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.client.cli import main
from calor.models.embedder import OnnxEmbedder
from calor.server.app import CalorServer
from calor.server.clock import ManualClock
from calor.server.config import ServerConfig
from calor.server.tls import TlsSetupError, check_certificate
from tests.conftest import ServerThread
from tests.tls_certs import ServerCert, make_server_cert


def validity(cert: Path) -> tuple[datetime, datetime]:
    """A certificate's (not before, not after)."""
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    return loaded.not_valid_before_utc, loaded.not_valid_after_utc


def stamp(moment: datetime) -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%SZ}"


def start_failure(
    config: ServerConfig, clock: ManualClock, embedder: OnnxEmbedder
) -> TlsSetupError:
    """What ``CalorServer.start()`` fails with on this clock."""
    server = CalorServer(config, clock=clock, embedder_factory=lambda: embedder)
    with pytest.raises(TlsSetupError) as failed:
        asyncio.run(server.start())
    server.runtime.executor.shutdown()
    return failed.value


@pytest.fixture
def cert(tmp_path: Path) -> ServerCert:
    return make_server_cert(tmp_path)


def tls_config(tmp_path: Path, cert: ServerCert) -> ServerConfig:
    return ServerConfig(
        data_dir=tmp_path / "data", host="127.0.0.1", port=0, tls_cert=cert.cert, tls_key=cert.key
    )


# --- through a real server start ------------------------------------------------------------


def test_a_certificate_expired_by_the_server_clock_stops_the_start(
    tmp_path: Path, cert: ServerCert, embedder: OnnxEmbedder
) -> None:
    _, not_after = validity(cert.cert)
    clock = ManualClock((not_after + timedelta(seconds=1)).timestamp())
    error = start_failure(tls_config(tmp_path, cert), clock, embedder)
    assert str(error) == f"--tls-cert {cert.cert}: the certificate expired on {stamp(not_after)}"


def test_a_certificate_not_valid_yet_stops_the_start(
    tmp_path: Path, cert: ServerCert, embedder: OnnxEmbedder
) -> None:
    not_before, _ = validity(cert.cert)
    clock = ManualClock((not_before - timedelta(days=1)).timestamp())
    error = start_failure(tls_config(tmp_path, cert), clock, embedder)
    expected = f"--tls-cert {cert.cert}: the certificate is not valid until {stamp(not_before)}"
    assert str(error) == expected


def test_the_same_certificate_serves_while_the_clock_is_inside_its_period(
    start_server: Callable[..., ServerThread], cert: ServerCert
) -> None:
    not_before, not_after = validity(cert.cert)
    clock = ManualClock((not_before + (not_after - not_before) / 2).timestamp())
    server = start_server(clock=clock, tls_cert=cert.cert, tls_key=cert.key)
    assert health(server.target, cert) == health_pb2.HealthCheckResponse.SERVING


def test_calor_serve_with_an_expired_certificate_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = datetime.now(UTC)
    expired = make_server_cert(
        tmp_path, not_before=now - timedelta(days=30), not_after=now - timedelta(days=1)
    )
    _, not_after = validity(expired.cert)
    status = main(
        ["serve", "--data-dir", str(tmp_path / "data"), "--port", "0",
         "--tls-cert", str(expired.cert), "--tls-key", str(expired.key)]
    )  # fmt: skip
    assert status == 1
    err = capsys.readouterr().err
    assert f"error: --tls-cert {expired.cert}: the certificate expired on {stamp(not_after)}" in err


def test_names_that_miss_the_host_warn_and_the_server_still_serves(
    start_server: Callable[..., ServerThread],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxied = make_server_cert(tmp_path, names=("calor.internal", "10.1.2.3"))
    with caplog.at_level(logging.WARNING, logger="calor.server"):
        server = start_server(tls_cert=proxied.cert, tls_key=proxied.key)  # binds 127.0.0.1
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING and "TLS" in r.message]
    assert warning.name == "calor.server"
    assert f"--tls-cert {proxied.cert} names calor.internal, 10.1.2.3, not --host 127.0.0.1" in (
        warning.message
    )
    # A client that dials the name the certificate has is served.
    assert health(server.target, proxied, name="calor.internal") == (
        health_pb2.HealthCheckResponse.SERVING
    )


def test_names_that_cover_the_host_make_no_warning(
    start_server: Callable[..., ServerThread], cert: ServerCert, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="calor.server"):
        start_server(tls_cert=cert.cert, tls_key=cert.key)
    assert not [r for r in caplog.records if "--tls-cert" in r.message]


def health(target: str, cert: ServerCert, name: str = "") -> int:
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.ca.read_bytes())
    options = [("grpc.ssl_target_name_override", name)] if name else []
    with grpc.secure_channel(target, credentials, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    return int(reply.status)


# --- the check itself -----------------------------------------------------------------------

NOW = datetime.now(UTC)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", ""])
def test_a_bind_on_every_address_names_no_host_to_check(tmp_path: Path, host: str) -> None:
    elsewhere = make_server_cert(tmp_path, names=("calor.internal",))
    assert check_certificate(elsewhere.cert, host, NOW) is None


@pytest.mark.parametrize(
    ("names", "host", "covered"),
    [
        (("localhost", "127.0.0.1"), "127.0.0.1", True),
        (("localhost", "127.0.0.1"), "LocalHost.", True),
        (("::1",), "[::1]", True),
        (("::1",), "0:0:0:0:0:0:0:1", True),
        (("localhost",), "127.0.0.1", False),  # an address needs its IP entry
        (("*.calor.internal",), "node-1.calor.internal", True),
        (("*.calor.internal",), "calor.internal", False),
        (("*.calor.internal",), "a.node-1.calor.internal", False),
        (("calor.internal",), "10.1.2.3", False),
        ((), "calor.internal", False),
    ],
)
def test_the_names_cover_a_host(
    tmp_path: Path, names: tuple[str, ...], host: str, covered: bool
) -> None:
    files = make_server_cert(tmp_path, names=names)
    warning = check_certificate(files.cert, host, NOW)
    assert (warning is None) == covered
    if warning is not None:
        assert f"--host {host}" in warning
        assert (", ".join(names) if names else "no subject alternative names") in warning


def test_an_expired_certificate_further_up_the_chain_is_named(tmp_path: Path) -> None:
    (tmp_path / "leaf").mkdir()
    (tmp_path / "old").mkdir()
    leaf = make_server_cert(tmp_path / "leaf")
    old = make_server_cert(
        tmp_path / "old", not_before=NOW - timedelta(days=30), not_after=NOW - timedelta(days=1)
    )
    chain = tmp_path / "chain.pem"
    chain.write_bytes(leaf.cert.read_bytes() + old.cert.read_bytes())
    with pytest.raises(
        TlsSetupError, match=r"certificate 2 of the chain \(CN=calor test server\) expired on "
    ):
        check_certificate(chain, "127.0.0.1", NOW)


def test_a_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("-----BEGIN NOTHING-----\n-----END NOTHING-----\n")
    with pytest.raises(TlsSetupError, match="empty.pem: no certificate"):
        check_certificate(empty, "127.0.0.1", NOW)

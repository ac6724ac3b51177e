"""TLS and mutual TLS: servers on a throwaway CA's certificates, reached through the
generated stubs, the Python clients and the CLI; plaintext and untrusting clients refused."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from calor.client import AsyncCalorClient, CalorClient, InvalidArgumentError, UnavailableError
from calor.client.cli import main
from calor.server.tls import TlsSetupError, server_credentials
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.tls_certs import TlsFiles, make_tls_files

CLI = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(start_server: Callable[..., ServerThread], tls: TlsFiles) -> ServerThread:
    """A server that speaks TLS only."""
    return start_server(tls_cert=tls.server_cert, tls_key=tls.server_key)


@pytest.fixture(scope="module")
def mtls_server(start_server: Callable[..., ServerThread], tls: TlsFiles) -> ServerThread:
    """A server that requires a client certificate signed by the test CA."""
    return start_server(tls_cert=tls.server_cert, tls_key=tls.server_key, tls_client_ca=tls.ca)


def secure_channel(target: str, ca: Path, tls: TlsFiles | None = None) -> grpc.Channel:
    """A stub channel trusting ``ca``; with ``tls``, presenting the test client certificate."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=tls.client_key.read_bytes() if tls else None,
        certificate_chain=tls.client_cert.read_bytes() if tls else None,
    )
    return grpc.secure_channel(target, credentials)


def health(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="")
    return int(stub.Check(request, timeout=10).status)  # type: ignore[attr-defined]


def refusal(channel: grpc.Channel) -> grpc.StatusCode:
    """The code a health check on ``channel`` fails with."""
    with pytest.raises(grpc.RpcError) as caught:
        health(channel)
    return caught.value.code()  # type: ignore[attr-defined, no-any-return]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], channel_name: str) -> CLI:
    """Run ``calor --channel … ARGS`` in-process; (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        status = main(["--channel", channel_name, *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


# --- through the generated stubs ------------------------------------------------------------


def test_plaintext_client_is_refused(tls_server: ServerThread) -> None:
    with grpc.insecure_channel(tls_server.target) as channel:
        assert refusal(channel) == grpc.StatusCode.UNAVAILABLE


def test_client_trusting_the_test_ca_is_served(
    tls_server: ServerThread, tls: TlsFiles, channel_name: str
) -> None:
    with secure_channel(tls_server.target, tls.ca) as channel:
        assert health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert "calor.v1.MemoryService" in ProtoReflectionDescriptorDatabase(channel).get_services()
        stub = MemoryServiceStub(channel)
        stored = stub.Store(pb.StoreRequest(channel=channel_name, text="Sent over TLS."))
        hits = stub.Recall(pb.RecallRequest(channel=channel_name, query="over TLS")).hits
    assert [hit.memory.id for hit in hits] == [stored.memory.id]


def test_the_certificate_names_localhost_too(tls_server: ServerThread, tls: TlsFiles) -> None:
    with secure_channel(f"localhost:{tls_server.port}", tls.ca) as channel:
        assert health(channel) == health_pb2.HealthCheckResponse.SERVING


def test_client_trusting_another_ca_is_refused(tls_server: ServerThread, tls: TlsFiles) -> None:
    with secure_channel(tls_server.target, tls.other_ca) as channel:
        assert refusal(channel) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_refuses_a_client_without_a_certificate(
    mtls_server: ServerThread, tls: TlsFiles
) -> None:
    with secure_channel(mtls_server.target, tls.ca) as channel:
        assert refusal(channel) == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(mtls_server.target) as channel:
        assert refusal(channel) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_serves_a_client_with_a_certificate(
    mtls_server: ServerThread, tls: TlsFiles
) -> None:
    with secure_channel(mtls_server.target, tls.ca, tls) as channel:
        assert health(channel) == health_pb2.HealthCheckResponse.SERVING


# --- through the Python clients ---------------------------------------------------------------


def test_calor_client_trusts_a_ca_file_or_pem_bytes(
    tls_server: ServerThread, tls: TlsFiles, channel_name: str
) -> None:
    with CalorClient(tls_server.target, channel=channel_name, tls_ca=tls.ca) as calor:
        ids = calor.store_many(["TLS carries client streams.", "And unary calls."])
        assert calor.health() == "SERVING"
    with CalorClient(tls_server.target, channel=channel_name, tls_ca=tls.ca.read_bytes()) as calor:
        exported = "".join(piece.markdown for piece in calor.export())
        hits = calor.recall("client streams", limit=1).hits
    assert hits[0].memory.id == ids[0]
    assert "TLS carries client streams." in exported


def test_calor_client_without_tls_is_refused(tls_server: ServerThread) -> None:
    with CalorClient(tls_server.target, timeout=10) as calor, pytest.raises(UnavailableError):
        calor.health()


def test_calor_client_presents_its_certificate(
    mtls_server: ServerThread, tls: TlsFiles, channel_name: str
) -> None:
    certificate = {"tls_cert": tls.client_cert, "tls_key": tls.client_key.read_bytes()}
    with CalorClient(
        mtls_server.target, channel=channel_name, tls_ca=tls.ca, **certificate
    ) as calor:
        assert calor.store("Mutual TLS lets this in.").id
    with CalorClient(mtls_server.target, tls_ca=tls.ca, timeout=10) as calor:
        with pytest.raises(UnavailableError):
            calor.health()


def test_async_client_over_mutual_tls(
    mtls_server: ServerThread, tls: TlsFiles, channel_name: str
) -> None:
    async def run() -> list[str]:
        async with AsyncCalorClient(
            mtls_server.target,
            channel=channel_name,
            tls_ca=tls.ca,
            tls_cert=tls.client_cert,
            tls_key=tls.client_key,
        ) as calor:
            ids = await calor.store_many(["Async over mutual TLS."])
            hits = (await calor.recall("async mutual TLS")).hits
            return [*ids, *(hit.memory.id for hit in hits)]

    first, *found = asyncio.run(run())
    assert found == [first]


def test_client_arguments_are_checked_before_any_call(tls: TlsFiles, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="tls_ca: not PEM"):
        CalorClient(tls_ca=b"not a certificate")
    with pytest.raises(InvalidArgumentError, match="tls_cert and tls_key go together"):
        CalorClient(tls_ca=tls.ca, tls_cert=tls.client_cert)
    with pytest.raises(FileNotFoundError):
        CalorClient(tls_ca=tmp_path / "missing.pem")
    with pytest.raises(TypeError, match="own credentials"):
        CalorClient(tls_ca=tls.ca, grpc_channel=grpc.insecure_channel("localhost:1"))


# --- through the CLI ------------------------------------------------------------------------


def test_cli_trusts_the_ca_it_is_given(tls_server: ServerThread, tls: TlsFiles, cli: CLI) -> None:
    status, out, err = cli("--target", tls_server.target, "--tls-ca", str(tls.ca), "store", "x y")
    assert (status, err) == (0, "")
    assert out.startswith("stored ")

    status, out, err = cli("--target", tls_server.target, "status")
    assert status == 1
    assert "UNAVAILABLE" in err
    assert "pass --tls-ca" in err


def test_cli_reads_the_ca_from_the_environment(
    tls_server: ServerThread, tls: TlsFiles, cli: CLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALOR_TLS_CA", str(tls.other_ca))
    status, _, err = cli("--target", tls_server.target, "status")
    assert status == 1
    assert "TLS with" in err and "--tls-ca" in err  # the handshake failed: trust is the fix

    monkeypatch.setenv("CALOR_TLS_CA", str(tls.ca))
    status, out, err = cli("--target", tls_server.target, "status")
    assert (status, err) == (0, "")


def test_cli_over_mutual_tls(mtls_server: ServerThread, tls: TlsFiles, cli: CLI) -> None:
    trust = ("--target", mtls_server.target, "--tls-ca", str(tls.ca))
    status, _, err = cli(*trust, "status")
    assert status == 1
    assert "UNAVAILABLE" in err

    status, _, err = cli(
        *trust,
        "--tls-client-cert",
        str(tls.client_cert),
        "--tls-client-key",
        str(tls.client_key),
        "status",
    )
    assert (status, err) == (0, "")


# --- start-up -------------------------------------------------------------------------------


def test_server_credentials_check_the_files(tls: TlsFiles, tmp_path: Path) -> None:
    assert server_credentials(None, None, None) is None
    assert server_credentials(tls.server_cert, tls.server_key, tls.ca) is not None
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    cases: list[tuple[tuple[Path | None, Path | None, Path | None], str]] = [
        ((tls.server_cert, None, None), "--tls-cert and --tls-key go together"),
        ((None, None, tls.ca), "--tls-client-ca needs --tls-cert and --tls-key"),
        ((tmp_path / "gone.pem", tls.server_key, None), "gone.pem: No such file"),
        ((not_pem, tls.server_key, None), "not.pem: not a PEM file"),
        ((tls.server_cert, tls.client_key, None), "not a certificate and its"),
        ((tls.server_cert, tls.server_key, tls.server_key), "--tls-client-ca"),
    ]
    for arguments, message in cases:
        with pytest.raises(TlsSetupError, match=message):
            server_credentials(*arguments)


def test_serve_with_a_missing_certificate_fails_at_start(tmp_path: Path, tls: TlsFiles) -> None:
    missing = tmp_path / "missing.pem"
    command = [str(Path(sys.executable).with_name("calor")), "serve", "--data-dir", str(tmp_path)]
    flags = ["--port", "0", "--tls-cert", str(missing), "--tls-key", str(tls.server_key)]
    done = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"error: --tls-cert {missing}: No such file or directory" in done.stderr


def test_serve_takes_no_client_trust_flags(cli: CLI) -> None:
    # `calor serve --tls-ca` would be an easy slip for --tls-client-ca: it is refused.
    status, _, err = cli("serve", "--tls-ca", "ca.pem")
    assert status == 2
    assert "unrecognized arguments: --tls-ca" in err


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests see only the key and trust they set themselves."""
    for name in ("CALOR_API_KEY", "CALOR_TLS_CA", "CALOR_TLS_CLIENT_CERT", "CALOR_TLS_CLIENT_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield

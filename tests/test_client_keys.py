"""Clients that send API keys: CalorClient, AsyncCalorClient, the CLI and `calor mcp` reach a
server started with an auth file with their key, over plaintext and over TLS, streams
included, and are refused without it."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from mcp import Client, StdioServerParameters, types

from calor.client import AsyncCalorClient, CalorClient, PermissionDeniedError
from calor.client._credentials import ChannelSecurity
from calor.client.cli import main
from calor.client.errors import UnauthenticatedError
from tests.conftest import ServerThread
from tests.tls_certs import TlsFiles, make_tls_files

CLI = Callable[..., tuple[int, str, str]]
SECRET = "s3cr3t-of-the-agents-key-0123456789abcdef"
OTHER_SECRET = "s3cr3t-of-the-other-key-0123456789abcdef"
KEY = f"calor_agents_{SECRET}"  # `calor_<id>_<secret>`, as `calor keys add` prints it
OTHER_KEY = f"calor_other_{OTHER_SECRET}"
UNKNOWN_KEY = "calor_agents_not-the-secret"


@dataclass(frozen=True)
class Servers:
    """Two servers checking the same auth file: one plaintext, one TLS."""

    plain: ServerThread
    tls: ServerThread
    files: TlsFiles


def write_auth_file(path: Path) -> Path:
    """An auth file (the README's format): ``agents`` may read and write ``keys-*``
    channels, ``other`` only ``elsewhere/*``."""
    path.write_text(
        f"""
[keys.agents]
label = "the agents"
sha256 = "{hashlib.sha256(SECRET.encode()).hexdigest()}"

[keys.agents.grants]
"keys-*" = ["read", "write"]

[keys.other]
label = "someone else"
sha256 = "{hashlib.sha256(OTHER_SECRET.encode()).hexdigest()}"

[keys.other.grants]
"elsewhere/*" = ["read", "write", "admin"]
"""
    )
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def servers(
    start_server: Callable[..., ServerThread], tmp_path_factory: pytest.TempPathFactory
) -> Servers:
    folder = tmp_path_factory.mktemp("keys")
    auth_file = write_auth_file(folder / "keys.toml")
    files = make_tls_files(folder)
    return Servers(
        plain=start_server(auth_file=auth_file),
        tls=start_server(auth_file=auth_file, tls_cert=files.server_cert, tls_key=files.server_key),
        files=files,
    )


@pytest.fixture
def keys_channel(channel_name: str) -> str:
    """A channel of the test's own that the ``agents`` key is granted."""
    return f"keys-{channel_name}"[:120]


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests see only the key and trust they set themselves."""
    for name in ("CALOR_API_KEY", "CALOR_TLS_CA", "CALOR_TLS_CLIENT_CERT", "CALOR_TLS_CLIENT_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield


def connections(servers: Servers) -> list[tuple[str, dict[str, Any]]]:
    """(target, client arguments) for the plaintext and the TLS server."""
    return [(servers.plain.target, {}), (servers.tls.target, {"tls_ca": servers.files.ca})]


# --- CalorClient ------------------------------------------------------------------------------


def test_calor_client_sends_its_key_on_every_kind_of_call(
    servers: Servers, keys_channel: str
) -> None:
    for target, trust in connections(servers):
        with CalorClient(target, channel=keys_channel, api_key=KEY, **trust) as calor:
            first = calor.store("The agents key opens this channel.")  # unary
            ids = calor.store_many(["A client stream.", "Carries the key too."])  # client stream
            exported = "".join(p.markdown for p in calor.export())  # server stream
            with calor.subscribe(channels=[keys_channel], resume=False, after_seq=0) as events:
                event = next(iter(events))  # server stream, open until closed
            imported = calor.import_markdown(exported, channel=f"{keys_channel}-copy")
        assert first.id and len(ids) == 2
        assert "A client stream." in exported
        assert event.channel == keys_channel
        assert len(imported) == 3


def test_calor_client_reads_the_key_from_the_environment(
    servers: Servers, keys_channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALOR_API_KEY", KEY)
    for target, trust in connections(servers):
        with CalorClient(target, channel=keys_channel, **trust) as calor:
            assert calor.store("Found in CALOR_API_KEY.").id


def test_calor_client_without_a_key_is_unauthenticated(servers: Servers, keys_channel: str) -> None:
    for target, trust in connections(servers):
        for key in (None, UNKNOWN_KEY):
            with CalorClient(target, channel=keys_channel, api_key=key, **trust) as calor:
                with pytest.raises(UnauthenticatedError) as refused:
                    calor.store("No key, no memory.")
                assert isinstance(refused.value, PermissionDeniedError)
                with pytest.raises(UnauthenticatedError):
                    calor.store_many(["Nor a stream of them."])


def test_a_key_not_granted_the_channel_is_permission_denied(
    servers: Servers, keys_channel: str
) -> None:
    for target, trust in connections(servers):
        with CalorClient(target, channel=keys_channel, api_key=OTHER_KEY, **trust) as calor:
            with pytest.raises(PermissionDeniedError) as refused:
                calor.store("Not this key's channel.")
        assert not isinstance(refused.value, UnauthenticatedError)


# --- AsyncCalorClient ------------------------------------------------------------------------


async def _chunks(text: str) -> AsyncIterator[str]:
    yield text


def test_async_client_sends_its_key_on_every_kind_of_call(
    servers: Servers, keys_channel: str
) -> None:
    async def run(target: str, trust: dict[str, Any]) -> None:
        async with AsyncCalorClient(target, channel=keys_channel, api_key=KEY, **trust) as calor:
            assert (await calor.store("Async with a key.")).id
            assert len(await calor.store_many(["An async client stream."])) == 1
            exported = "".join([p.markdown async for p in calor.export()])
            copy = f"{keys_channel}-async-copy"
            assert len(await calor.import_markdown(_chunks(exported), channel=copy)) == 2
            events = calor.subscribe(channels=[keys_channel], resume=False, after_seq=0)
            event = await anext(events)
            await events.aclose()
            assert event.channel == keys_channel

        async with AsyncCalorClient(target, channel=keys_channel, **trust) as calor:
            with pytest.raises(UnauthenticatedError):
                await calor.store("No key.")
            with pytest.raises(UnauthenticatedError):
                await anext(calor.subscribe(channels=[keys_channel], resume=False, after_seq=0))

    for target, trust in connections(servers):
        asyncio.run(run(target, trust))


# --- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], keys_channel: str) -> CLI:
    """Run ``calor --channel … ARGS`` in-process; (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        status = main(["--channel", keys_channel, *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_cli_passes_the_key_it_is_given(servers: Servers, cli: CLI, keys_channel: str) -> None:
    tls = ("--tls-ca", str(servers.files.ca))
    for target, trust in ((servers.plain.target, ()), (servers.tls.target, tls)):
        status, out, err = cli(
            "--target", target, *trust, "--api-key", KEY, "store", "From a shell."
        )
        assert (status, err) == (0, "")
        memory_id = out.split()[1]
        status, out, err = cli(
            "--target", target, *trust, "subscribe", "--after-seq", "0", "--max-events", "1"
        )
        assert status == 1
        assert "UNAUTHENTICATED" in err
        assert "set CALOR_API_KEY or pass --api-key" in err
        status, out, err = cli(
            "--target",
            target,
            *trust,
            "subscribe",
            "--api-key",
            KEY,
            "--after-seq",
            "0",
            "--max-events",
            "1",
        )
        assert (status, err) == (0, "")
        assert f"on_store {keys_channel} {memory_id}" in out


def test_cli_reads_the_key_from_the_environment(
    servers: Servers, cli: CLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALOR_API_KEY", KEY)
    status, _, err = cli("--target", servers.plain.target, "status")
    assert (status, err) == (0, "")

    monkeypatch.setenv("CALOR_API_KEY", OTHER_KEY)
    status, _, err = cli("--target", servers.plain.target, "status")
    assert status == 1
    assert "PERMISSION_DENIED" in err
    assert "not granted" in err


def test_cli_refuses_a_key_no_header_can_carry(servers: Servers, cli: CLI) -> None:
    status, _, err = cli("--target", servers.plain.target, "--api-key", "two words", "status")
    assert status == 2
    assert "api_key: not an API key" in err


# --- calor mcp -------------------------------------------------------------------------------


def mcp_store(target: str, channel: str, *flags: str) -> types.CallToolResult:
    """Start `calor mcp` with ``flags`` as a host would and call ``memory_store`` once."""
    command = str(Path(sys.executable).with_name("calor"))
    args = ["mcp", "--target", target, "--channel", channel, *flags]
    server = StdioServerParameters(command=command, args=args)
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(server)) as client:
            result: types.CallToolResult = portal.call(
                client.call_tool, "memory_store", {"text": "Stored by an agent host."}
            )
    return result


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def test_mcp_passes_the_key_and_trust_it_is_given(servers: Servers, keys_channel: str) -> None:
    tls = ("--tls-ca", str(servers.files.ca), "--api-key", KEY)
    result = mcp_store(servers.tls.target, keys_channel, *tls)
    assert not result.is_error, text_of(result)

    trust = servers.files.ca
    with CalorClient(servers.tls.target, channel=keys_channel, api_key=KEY, tls_ca=trust) as calor:
        assert calor.identity().total == 1


def test_mcp_without_a_key_is_a_tool_error_with_a_hint(servers: Servers, keys_channel: str) -> None:
    result = mcp_store(servers.plain.target, keys_channel)
    assert result.is_error
    text = text_of(result)
    assert text.startswith("UNAUTHENTICATED: ")
    assert "set CALOR_API_KEY or pass --api-key" in text


def test_an_empty_key_sends_none_whatever_the_environment_says(
    servers: Servers, keys_channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALOR_API_KEY", KEY)
    with CalorClient(servers.plain.target, channel=keys_channel, api_key="") as calor:
        with pytest.raises(UnauthenticatedError):
            calor.identity()


def test_the_key_stays_out_of_reprs() -> None:
    security = ChannelSecurity.of(api_key=KEY)
    assert security.metadata == (("authorization", f"Bearer {KEY}"),)
    assert SECRET not in repr(security)
    with CalorClient("localhost:1", api_key=KEY) as calor:
        assert SECRET not in repr(calor)

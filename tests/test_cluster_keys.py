"""Cluster mode: the API keys are one of the cluster's shared settings. A node started
with ``--auth-file`` publishes its file when the cluster has no keys yet, every node
(with a file or not) serves the cluster's keys, and a SIGHUP publishes the file again,
so a key added to it is accepted, and a key taken out of it refused, through every
node. Own NATS servers: the keys published here would close the other tests' cluster.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from calor.server.api import auth_file
from calor.server.api.grants import Grants, parse_grant
from calor.server.cluster.local import NatsServers
from calor.v1 import memory_service_pb2 as pb
from tests.cluster_nodes import CHANNEL, Node, nats_cluster


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServers]:
    yield from nats_cluster(tmp_path_factory)


def add_key(path: Path, grant: str) -> tuple[str, str]:
    """Add a key to the auth file (made if missing); its (id, token)."""
    keys = auth_file.load(path) if path.exists() else auth_file.KeyRing()
    key, token = auth_file.new_key("cluster test", Grants((parse_grant(grant),)))
    auth_file.save(path, keys.with_key(key))
    return key.id, token


def listing(node: Node, token: str | None) -> Callable[[], object]:
    """A ListMemories call through ``node`` with ``token`` (or none)."""
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    request = pb.ListMemoriesRequest(channel=CHANNEL, page_size=1)
    return lambda: node.stub.ListMemories(request, metadata=metadata, timeout=5.0)


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def until(call: Callable[[], object], code: grpc.StatusCode, within: float = 30.0) -> None:
    """Wait until ``call`` answers ``code`` (a node joining, or keys on their way)."""
    give_up = time.monotonic() + within
    while (answered := code_of(call)) != code:
        assert time.monotonic() < give_up, f"still {answered.name}, not {code.name}"
        time.sleep(0.2)


def test_keys_of_one_node_are_served_by_every_node_and_a_reload_reaches_them_all(
    nats: NatsServers, tmp_path: Path
) -> None:
    path = tmp_path / "keys.toml"
    first_id, first = add_key(path, "*=admin")
    with Node(nats, tmp_path / "a", "a", "--auth-file", str(path)) as keyed:
        until(listing(keyed, first), grpc.StatusCode.OK)
        with Node(nats, tmp_path / "b", "b") as plain:  # no file: the cluster's keys
            until(listing(plain, first), grpc.StatusCode.OK)
            assert code_of(listing(plain, None)) == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(listing(plain, "calor_nope_x")) == grpc.StatusCode.UNAUTHENTICATED
            _, second = add_key(path, f"{CHANNEL}=read")
            assert code_of(listing(plain, second)) == grpc.StatusCode.UNAUTHENTICATED
            keys = auth_file.load(path)
            auth_file.save(path, keys.without(first_id))
            keyed.process.process.send_signal(signal.SIGHUP)  # published to every node
            until(listing(plain, second), grpc.StatusCode.OK)
            until(listing(plain, first), grpc.StatusCode.UNAUTHENTICATED)
            assert code_of(listing(keyed, first)) == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(listing(keyed, second)) == grpc.StatusCode.OK

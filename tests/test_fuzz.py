"""Property-based fuzzing of every RPC: requests built field by field from the message
descriptors, each answered OK or with a clean client error, never UNKNOWN or INTERNAL,
and the server still SERVING after every example.

The RPCs are read from the descriptors of every service in the calor.v1 protos, and of
health and reflection, so a new service, RPC or field is fuzzed without editing this
file. How requests are made is in tests/fuzz_requests.py: mostly plausible, so they
get past validation and into the engine, with a field or two hostile.

``make test`` runs a short, derandomized profile (20 examples per RPC); ``make soak``
a long random one (``FUZZ_EXAMPLES``, default 500 per RPC). A failure prints the
falsifying request and how to reproduce it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import calor.v1
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.fuzz_requests import Pools, Requests


def _services() -> list[ServiceDescriptor]:
    """Every service of the calor.v1 protos, then the health and reflection services."""
    found: list[ServiceDescriptor] = []
    for module in sorted(pkgutil.iter_modules(calor.v1.__path__), key=lambda m: m.name):
        if module.name.endswith("_pb2"):
            proto = importlib.import_module(f"calor.v1.{module.name}")
            found += proto.DESCRIPTOR.services_by_name.values()
    return [
        *found,
        *health_pb2.DESCRIPTOR.services_by_name.values(),
        *reflection_pb2.DESCRIPTOR.services_by_name.values(),
    ]


SERVICES = _services()
# Fuzzed last: it empties the channels the other RPCs aim at.
LAST = ("MemoryService.DropChannel",)
METHODS = {f"{m.containing_service.name}.{m.name}": m for s in SERVICES for m in s.methods}
METHODS = {name: METHODS[name] for name in sorted(METHODS, key=lambda name: name in LAST)}

Code = grpc.StatusCode
CLEAN = {
    Code.OK,
    Code.INVALID_ARGUMENT,
    Code.NOT_FOUND,
    Code.FAILED_PRECONDITION,
    Code.OUT_OF_RANGE,
    Code.ALREADY_EXISTS,
    Code.RESOURCE_EXHAUSTED,
    Code.PERMISSION_DENIED,
    Code.UNAUTHENTICATED,
}
# A server stream is read for a moment and then left: Subscribe and Watch wait for more.
STREAM_READ_S = 0.25
CALL_TIMEOUT_S = 60.0

CHANNELS = ("fuzz-a", "fuzz-b")
# Settings fuzzed into these channels are exercised afterwards (the last test).
SETTINGS_CHANNELS = ("fuzz-settings-a", "fuzz-settings-b")


def call(channel: grpc.Channel, method: MethodDescriptor, requests: list[Message]) -> Code:
    """Send the requests to the RPC; the status it ends with."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    out = GetMessageClass(method.output_type).FromString
    send = GetMessageClass(method.input_type).SerializeToString
    try:
        if method.client_streaming and method.server_streaming:
            replies = channel.stream_stream(path, send, out)(iter(requests), timeout=STREAM_READ_S)
            return _read(replies)
        if method.client_streaming:
            channel.stream_unary(path, send, out)(iter(requests), timeout=CALL_TIMEOUT_S)
        elif method.server_streaming:
            return _read(channel.unary_stream(path, send, out)(requests[0], timeout=STREAM_READ_S))
        else:
            channel.unary_unary(path, send, out)(requests[0], timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as error:
        return _checked(error, method)
    return Code.OK


def _read(replies: Any) -> Code:
    """Read a server stream until it ends or the short deadline passes."""
    try:
        for _ in replies:
            pass
    except grpc.RpcError as error:
        if error.code() == Code.DEADLINE_EXCEEDED:  # the stream was waiting for more
            return Code.OK
        raise
    return Code.OK


def _checked(error: grpc.RpcError, method: MethodDescriptor) -> Code:
    code = error.code()
    # Health and reflection are the grpc library's: it decides which of their methods
    # it serves (this grpcio's health service has no List).
    foreign = not method.full_name.startswith("calor.")
    clean = code in CLEAN or (foreign and code == Code.UNIMPLEMENTED)
    assert clean, f"{method.full_name} answered {code.name}: {error.details()}"
    return code


def _shown(requests: list[Message]) -> str:
    text = "\n---\n".join(text_format.MessageToString(r, as_utf8=True) for r in requests)
    return text if len(text) < 4000 else text[:4000] + f"… ({len(text)} characters)"


def profile(name: str) -> settings:
    """``quick`` for make test (derandomized: the same examples every run), ``soak``."""
    quick = name == "quick"
    return settings(
        max_examples=20 if quick else int(os.environ.get("FUZZ_EXAMPLES", "500")),
        deadline=None,
        derandomize=quick,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
def fuzzed(start_server: Callable[..., ServerThread]) -> Iterator[tuple[ServerThread, Pools]]:
    """One server for every example, with memories, triggers and a recall to aim at."""
    server = start_server()
    pools = Pools()
    with grpc.insecure_channel(server.target) as channel:
        memories, triggers = MemoryServiceStub(channel), TriggerServiceStub(channel)
        for name in (*CHANNELS, *SETTINGS_CHANNELS):
            texts = [
                "The user is allergic to peanuts.",
                "Ana moved to Lisbon last week.",
                "Ana likes strong coffee in the morning.",
                "Deploy: build, test, tag, push.",
                "The spare key is under the blue flowerpot.",
            ]
            requests = [
                pb.StoreStreamRequest(store=pb.StoreRequest(channel=name, text=t)) for t in texts
            ]
            pools.memory_ids += memories.StoreStream(iter(requests)).ids
            recall = memories.Recall(pb.RecallRequest(channel=name, query="where is Ana?"))
            pools.recall_ids.append(recall.recall_id)
            for trigger in _triggers(name):
                created = triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=trigger))
                pools.trigger_ids.append(created.trigger.id)
                pools.templates.setdefault(tpb.Trigger.DESCRIPTOR.full_name, []).append(trigger)
        settings = SettingsServiceStub(channel)
        for name in SETTINGS_CHANNELS:
            found = settings.GetSettings(spb.GetSettingsRequest(channel=name)).settings
            pools.templates.setdefault(found.DESCRIPTOR.full_name, []).append(found)
    yield server, pools


def _triggers(channel: str) -> list[tpb.Trigger]:
    """Valid triggers of several kinds in a channel."""
    on_store = tpb.EVENT_KIND_ON_STORE
    return [
        tpb.Trigger(
            channel=channel,
            event=on_store,
            action=tpb.ACTION_KIND_NOTIFY,
            config={"message": "saw {text}"},
        ),
        tpb.Trigger(
            channel=channel,
            event=tpb.EVENT_KIND_ON_RECALL,
            action=tpb.ACTION_KIND_BOOST,
            config={"delta": "0.05"},
            filter_pattern="Ana",
            max_fires=3,
        ),
        tpb.Trigger(
            channel=channel,
            event=on_store,
            action=tpb.ACTION_KIND_TAG,
            config={"key": "seen", "value": "yes"},
            cooldown_seconds=1.0,
        ),
    ]


def fuzz(server: ServerThread, pools: Pools, method: MethodDescriptor, name: str) -> None:
    settings_rpc = method.containing_service.name == "SettingsService"
    requests = Requests(pools, SETTINGS_CHANNELS if settings_rpc else CHANNELS)
    one = requests.message(method.input_type)
    batch = (
        st.lists(one, min_size=0, max_size=3)
        if method.client_streaming
        else st.lists(one, min_size=1, max_size=1)
    )
    codes: Counter[str] = Counter()
    health_request = health_pb2.HealthCheckRequest(service="")
    serving = health_pb2.HealthCheckResponse.SERVING
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(server.target, options=options) as channel:
        health = health_pb2_grpc.HealthStub(channel)

        @profile(name)
        @given(batch)
        def answers_cleanly(messages: list[Message]) -> None:
            try:
                codes[call(channel, method, messages).name] += 1
            except AssertionError as failure:
                raise AssertionError(f"{failure}\nrequest:\n{_shown(messages)}") from None
            status = health.Check(health_request, timeout=CALL_TIMEOUT_S).status
            assert status == serving, f"not SERVING after {method.full_name}:\n{_shown(messages)}"

        answers_cleanly()
    print(f"{method.full_name}: {dict(codes.most_common())}")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("rpc", list(METHODS))
def test_every_rpc_answers_fuzzed_requests_cleanly(
    fuzzed: tuple[ServerThread, Pools], rpc: str
) -> None:
    server, pools = fuzzed
    fuzz(server, pools, METHODS[rpc], "quick")


@pytest.mark.soak
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("rpc", list(METHODS))
def test_every_rpc_answers_fuzzed_requests_cleanly_soak(
    fuzzed: tuple[ServerThread, Pools], rpc: str
) -> None:
    server, pools = fuzzed
    fuzz(server, pools, METHODS[rpc], "soak")


def exercise_settings_channels(server: ServerThread) -> None:
    """Whatever settings the fuzzing left in place, the channels still store, recall,
    build context, dream and report cleanly."""
    with grpc.insecure_channel(server.target) as channel:
        memories = MemoryServiceStub(channel)
        for name in SETTINGS_CHANNELS:
            calls: list[tuple[Callable[..., object], Message]] = [
                (memories.Store, pb.StoreRequest(channel=name, text="Ana sings on Sundays.")),
                (memories.Recall, pb.RecallRequest(channel=name, query="what does Ana do?")),
                (memories.Context, pb.ContextRequest(channel=name, message="Ana")),
                (memories.Dream, pb.DreamRequest(channel=name)),
                (memories.Identity, pb.IdentityRequest(channel=name)),
                (memories.Evaluate, pb.EvaluateRequest(channel=name, text="Ana never sings.")),
            ]
            for rpc, request in calls:
                try:
                    rpc(request, timeout=CALL_TIMEOUT_S)
                except grpc.RpcError as error:
                    what = f"{type(request).__name__} in {name}"
                    assert error.code() in CLEAN, f"{what}: {error.code().name}: {error.details()}"


def test_channels_with_fuzzed_settings_still_answer(fuzzed: tuple[ServerThread, Pools]) -> None:
    exercise_settings_channels(fuzzed[0])


@pytest.mark.soak
def test_channels_with_fuzzed_settings_still_answer_soak(
    fuzzed: tuple[ServerThread, Pools],
) -> None:
    exercise_settings_channels(fuzzed[0])

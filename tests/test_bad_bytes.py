"""Requests that are not what their RPC takes — bytes that do not parse, enum numbers the
enum lacks — answer INVALID_ARGUMENT on every RPC, streams included, and change nothing.

The RPCs and their enum fields are read from the service descriptors, so a new RPC or
field is covered without editing this file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from calor.v1 import memory_service_pb2, settings_service_pb2, trigger_service_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.helpers import total

SERVICES = [
    memory_service_pb2.DESCRIPTOR.services_by_name["MemoryService"],
    trigger_service_pb2.DESCRIPTOR.services_by_name["TriggerService"],
    settings_service_pb2.DESCRIPTOR.services_by_name["SettingsService"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
]
METHODS = {f"{m.containing_service.name}.{m.name}": m for s in SERVICES for m in s.methods}

GARBAGE = {
    "corrupt varint": b"\xff" * 11,
    "truncated field": b"\x0a\x7f",
    "field number 0": b"\x00\x01",
    "bad UTF-8": b"\x0a\x02\xff\xfe",
}


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def call_raw(
    channel: grpc.Channel, method: MethodDescriptor, messages: list[bytes], timeout: float = 30
) -> None:
    """Send serialized messages to an RPC as they are; raises the call's RpcError."""
    path = _path(method)
    if method.client_streaming and method.server_streaming:
        list(channel.stream_stream(path)(iter(messages), timeout=timeout))
    elif method.client_streaming:
        channel.stream_unary(path)(iter(messages), timeout=timeout)
    elif method.server_streaming:
        [message] = messages
        # The first answer or the error: Subscribe and Watch would stream on.
        next(iter(channel.unary_stream(path)(message, timeout=timeout)), None)
    else:
        [message] = messages
        channel.unary_unary(path)(message, timeout=timeout)


def refusal(
    channel: grpc.Channel, method: MethodDescriptor, messages: list[bytes]
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call_raw(channel, method, messages)
    return caught.value


def _does_not_parse(method: MethodDescriptor, data: bytes) -> bool:
    try:
        GetMessageClass(method.input_type).FromString(data)
    except DecodeError:
        return True
    return False


CASES = [
    (name, sample)
    for name, method in METHODS.items()
    for sample, data in GARBAGE.items()
    if _does_not_parse(method, data)
]


def test_some_garbage_fails_to_parse_for_every_request_type() -> None:
    for name, method in METHODS.items():
        assert _does_not_parse(method, GARBAGE["corrupt varint"]), name
        assert _does_not_parse(method, GARBAGE["truncated field"]), name


@pytest.mark.parametrize(("name", "sample"), CASES)
def test_bytes_that_are_not_the_request_answer_invalid_argument(
    grpc_channel: grpc.Channel, name: str, sample: str
) -> None:
    method = METHODS[name]
    error = refusal(grpc_channel, method, [GARBAGE[sample]])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert f"not a valid {method.input_type.full_name}" in (error.details() or "")


def _store(channel: str, text: str) -> bytes:
    request = pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel, text=text))
    return request.SerializeToString()


def test_a_bad_message_mid_stream_ends_store_stream_and_stores_nothing(
    grpc_channel: grpc.Channel, memories: MemoryServiceStub, channel_name: str
) -> None:
    good = [_store(channel_name, f"note number {n} about the garden") for n in range(3)]
    error = refusal(grpc_channel, METHODS["MemoryService.StoreStream"], [*good, b"\xff" * 11])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("message 3: the request is not a valid")
    assert total(memories, channel_name) == 0


def test_a_bad_message_mid_import_ends_it_and_imports_nothing(
    grpc_channel: grpc.Channel, memories: MemoryServiceStub, channel_name: str
) -> None:
    first = pb.ImportRequest(channel=channel_name, markdown="- the shed key is blue\n")
    error = refusal(
        grpc_channel, METHODS["MemoryService.Import"], [first.SerializeToString(), b"\x0a\x7f"]
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message 1: the request is not a valid calor.v1.ImportRequest" in (error.details() or "")
    assert total(memories, channel_name) == 0


# --- enum numbers the enum does not define ----------------------------------------------


@dataclass(frozen=True)
class EnumField:
    """One enum field reachable in a request: its path as the server names it."""

    method: str
    path: tuple[FieldDescriptor, ...]

    @property
    def name(self) -> str:
        return ".".join(f.name + ("[0]" if f.is_repeated else "") for f in self.path)

    def request(self, number: int) -> Message:
        """The method's request with this field (and nothing else) set to ``number``."""
        request = GetMessageClass(METHODS[self.method].input_type)()
        holder: Message = request
        *outer, last = self.path
        for field in outer:
            if field.is_repeated:
                holder = getattr(holder, field.name).add()
            else:
                holder = getattr(holder, field.name)
                holder.SetInParent()
        if last.is_repeated:
            getattr(holder, last.name).append(number)
        else:
            setattr(holder, last.name, number)
        return request


def _enum_paths(
    message: Descriptor, trail: tuple[FieldDescriptor, ...] = ()
) -> Iterator[tuple[FieldDescriptor, ...]]:
    for field in message.fields:
        if field.enum_type is not None:
            yield (*trail, field)
        elif (
            field.message_type is not None
            and not field.message_type.GetOptions().map_entry
            and field.message_type not in [f.message_type for f in trail]
        ):
            yield from _enum_paths(field.message_type, (*trail, field))


ENUM_FIELDS = [
    EnumField(name, path)
    for name, method in METHODS.items()
    for path in _enum_paths(method.input_type)
]


def test_the_enum_fields_the_design_names_are_covered() -> None:
    named = {(f.method, f.name) for f in ENUM_FIELDS}
    assert {
        ("TriggerService.Subscribe", "kinds[0]"),
        ("MemoryService.Store", "memory_type"),
        ("MemoryService.Forget", "filter.states[0]"),
        ("MemoryService.Feedback", "rating"),
        ("TriggerService.CreateTrigger", "trigger.action"),
        ("SettingsService.UpdateSettings", "settings.profiles[0].memory_type"),
    } <= named


@pytest.mark.parametrize("field", ENUM_FIELDS, ids=lambda f: f"{f.method}.{f.name}")
def test_an_unknown_enum_number_is_refused_naming_the_field(
    grpc_channel: grpc.Channel, field: EnumField
) -> None:
    request = field.request(99)
    error = refusal(grpc_channel, METHODS[field.method], [request.SerializeToString()])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    enum = field.path[-1].enum_type.full_name
    first = "message 0: " if METHODS[field.method].client_streaming else ""
    assert error.details() == f"{first}{field.name}: 99 is not a {enum} value"


def test_a_stream_message_with_an_unknown_enum_ends_the_stream_and_stores_nothing(
    grpc_channel: grpc.Channel, memories: MemoryServiceStub, channel_name: str
) -> None:
    good = _store(channel_name, "the heron came back to the pond")
    bad = pb.StoreStreamRequest(
        store=pb.StoreRequest(channel=channel_name, text="and left again", source=42)  # type: ignore[arg-type]
    )
    error = refusal(
        grpc_channel, METHODS["MemoryService.StoreStream"], [good, bad.SerializeToString()]
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "message 1: store.source: 42 is not a calor.v1.Source value"
    assert total(memories, channel_name) == 0

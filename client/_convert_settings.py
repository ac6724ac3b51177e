"""Channel settings requests for both clients: an update from keyword arguments, masked by
their names, and the enum names settings take."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc
from google.protobuf.descriptor import EnumValueDescriptor, FieldDescriptor
from google.protobuf.field_mask_pb2 import FieldMask

from calor.client._convert import check_options
from calor.client._enums import parse_type
from calor.client.errors import InvalidArgumentError
from calor.v1 import memory_pb2, settings_service_pb2

__all__ = [
    "PROFILE_FIELDS",
    "SETTING_FIELDS",
    "enum_name",
    "enum_number",
    "settings_request",
]

SETTING_FIELDS: dict[str, FieldDescriptor] = dict(
    memory_pb2.ChannelSettings.DESCRIPTOR.fields_by_name
)
"""Every field of ``ChannelSettings`` by name, in the order the proto declares them."""

PROFILE_FIELDS: tuple[str, ...] = tuple(
    name for name in memory_pb2.TypeProfile.DESCRIPTOR.fields_by_name if name != "memory_type"
)
"""What a type's profile holds: ``("half_life_seconds", "floor", "stability_gain")``."""


def _values(field: FieldDescriptor) -> tuple[str, list[EnumValueDescriptor]]:
    """An enum field's value prefix (``DECAY_MODE_``, …) and its values but UNSPECIFIED."""
    enum = field.enum_type
    if enum is None:
        raise TypeError(f"{field.name} is not an enum field")
    return enum.values[0].name.removesuffix("UNSPECIFIED"), list(enum.values[1:])


def enum_number(field: FieldDescriptor, value: object) -> int:
    """An enum field's number from a short name (``"hybrid"``), a full name or a number.

    Raises:
        InvalidArgumentError: The name or number is none of the field's values.
        TypeError: The value is neither a name nor a number.
    """
    if not isinstance(value, str | int):
        raise TypeError(f"{field.name}: expected a name or a number, got {value!r}")
    prefix, values = _values(field)
    names = (
        {value.strip().upper(), prefix + value.strip().upper()} if isinstance(value, str) else ()
    )
    for known in values:
        if known.number == value or known.name in names:
            return int(known.number)
    choices = ", ".join(enum_name(field, v.number) for v in values)
    raise InvalidArgumentError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{field.name}: unknown value {value!r} (expected one of {choices})",
    )


def enum_name(field: FieldDescriptor, number: int) -> str:
    """The short, lower-case name of an enum field's value; the number if it has none."""
    prefix, values = _values(field)
    named = [value.name for value in values if value.number == number]
    return named[0].removeprefix(prefix).lower() if named else str(number)


def _profile(value: object) -> memory_pb2.TypeProfile:
    """A ``TypeProfile`` as given, or made from a mapping whose ``memory_type`` may be a name."""
    if isinstance(value, memory_pb2.TypeProfile):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"profiles: expected TypeProfile messages or mappings, got {value!r}")
    fields = dict(value)
    kind = fields.pop("memory_type", None)
    if kind is not None and not isinstance(kind, str | int):
        raise TypeError(f"profiles: memory_type must be a name or a number, got {kind!r}")
    profile = memory_pb2.TypeProfile(memory_type=parse_type(kind))
    for name, number in fields.items():
        setattr(profile, name, number)  # an unknown name or a non-number raises here
    return profile


def _items(value: object) -> list[object]:
    """The elements of a list setting; a lone string is one element, not its letters."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        return [value]
    return list(value)


def settings_request(
    channel: str, fields: Mapping[str, object]
) -> settings_service_pb2.UpdateSettingsRequest:
    """The ``UpdateSettingsRequest`` setting the ``ChannelSettings`` fields given.

    The update mask names exactly the fields given whose value is not None. Enum
    fields take names (``decay_mode="hybrid"``, ``dream_archive_exempt_types=
    ["semantic", "core"]``); ``profiles`` takes ``TypeProfile`` messages or mappings
    (``{"memory_type": "fact", "half_life_seconds": 3600, "floor": 0.1,
    "stability_gain": 2.0}``), each replacing the profile of its type.

    Raises:
        TypeError: A name is not a ``ChannelSettings`` field, or a value is of the
            wrong type for its field.
        InvalidArgumentError: An enum name is not one of its field's values.
    """
    check_options(fields, frozenset(SETTING_FIELDS))
    settings = memory_pb2.ChannelSettings()
    paths: list[str] = []
    for name, value in fields.items():
        if value is None:
            continue
        field = SETTING_FIELDS[name]
        repeated = field.is_repeated
        if name == "profiles":
            settings.profiles.extend(_profile(p) for p in _items(value))
        elif field.enum_type is not None and repeated:
            getattr(settings, name).extend(enum_number(field, v) for v in _items(value))
        elif field.enum_type is not None:
            setattr(settings, name, enum_number(field, value))
        else:
            setattr(settings, name, value)
        paths.append(name)
    return settings_service_pb2.UpdateSettingsRequest(
        channel=channel, settings=settings, update_mask=FieldMask(paths=paths)
    )

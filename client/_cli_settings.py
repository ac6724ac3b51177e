"""The ``calor settings`` commands: ``get`` shows a channel's settings, ``set KEY=VALUE …``
changes the ones named, each value read by its field's type in ``ChannelSettings``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from calor.client._convert_settings import (
    PROFILE_FIELDS,
    SETTING_FIELDS,
    enum_name,
    enum_number,
)
from calor.client._enums import MEMORY_TYPE_NAMES, parse_type, type_name
from calor.client.client import CalorClient
from calor.client.errors import InvalidArgumentError
from calor.v1 import memory_pb2

__all__ = ["add_settings_commands", "parse_setting"]

_Output = tuple[Message, str]
_Handler = Callable[[CalorClient, argparse.Namespace], _Output]

_PROFILES = "profiles"
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_INTEGERS = (
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
)


def _known() -> str:
    """Every key ``settings set`` takes, for the message that refuses an unknown one."""
    names = [name for name in SETTING_FIELDS if name != _PROFILES]
    profile = f"{_PROFILES}.TYPE.FIELD (TYPE: {', '.join(MEMORY_TYPE_NAMES)}; "
    profile += f"FIELD: {', '.join(PROFILE_FIELDS)})"
    return ", ".join([*names, profile])


def _number(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{key}: must be a finite number, got {text!r}")
    return value


def _value(field: FieldDescriptor, text: str) -> object:
    """A setting's value read by its field's type; enum names are checked here."""
    key = field.name
    try:
        if field.enum_type is not None and field.is_repeated:
            names = [name.strip() for name in text.split(",") if name.strip()]
            for name in names:
                enum_number(field, name)
            return names
        if field.enum_type is not None:
            enum_number(field, text)
            return text
    except InvalidArgumentError as err:
        raise argparse.ArgumentTypeError(err.details) from None
    if field.type == FieldDescriptor.TYPE_BOOL:
        if text.lower() not in (*_TRUE, *_FALSE):
            raise argparse.ArgumentTypeError(f"{key}: expected true or false, got {text!r}")
        return text.lower() in _TRUE
    if field.type in _INTEGERS:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}: not a whole number: {text!r}") from None
    if field.type == FieldDescriptor.TYPE_STRING:
        return text
    return _number(text, key)


def parse_setting(text: str) -> tuple[str, object]:
    """A ``KEY=VALUE`` argument of ``settings set`` as its key and typed value.

    ``profiles.TYPE.FIELD=X`` sets one number of a type's profile.

    Raises:
        argparse.ArgumentTypeError: Not KEY=VALUE, an unknown key (the message lists
            the known ones), or a value its field cannot hold.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    parts = key.split(".")
    if parts[0] == _PROFILES and len(parts) == 3:
        if parts[1] in MEMORY_TYPE_NAMES and parts[2] in PROFILE_FIELDS:
            return key, _number(raw, key)
    field = SETTING_FIELDS.get(key)
    if field is None or key == _PROFILES:
        raise argparse.ArgumentTypeError(f"unknown setting {key!r}; known: {_known()}")
    return key, _value(field, raw)


def _text(settings: memory_pb2.ChannelSettings, field: FieldDescriptor) -> str:
    """A setting's value as ``settings set`` reads it."""
    value = getattr(settings, field.name)
    if field.enum_type is not None and field.is_repeated:
        return ",".join(enum_name(field, number) for number in value)
    if field.enum_type is not None:
        return enum_name(field, value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def _rows(settings: memory_pb2.ChannelSettings) -> dict[str, str]:
    """Every setting by the key ``settings set`` takes, in the proto's order."""
    rows: dict[str, str] = {}
    for name, field in SETTING_FIELDS.items():
        if name != _PROFILES:
            rows[name] = _text(settings, field)
            continue
        for profile in settings.profiles:
            for attr in PROFILE_FIELDS:
                key = f"{_PROFILES}.{type_name(profile.memory_type)}.{attr}"
                rows[key] = f"{getattr(profile, attr):.12g}"
    return rows


def _table(rows: dict[str, str]) -> str:
    width = max((len(key) for key in rows), default=0)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows.items())


def _get(client: CalorClient, args: argparse.Namespace) -> _Output:
    settings = client.get_settings()
    return settings, _table(_rows(settings))


def _set(client: CalorClient, args: argparse.Namespace) -> _Output:
    """Apply every assignment in one update; profile numbers change only their type's
    profile, whose other numbers are read first."""
    fields: dict[str, Any] = {}  # Any: update_settings also takes channel=
    profiles: dict[str, dict[str, object]] = {}
    for key, value in args.assignments:
        if key.startswith(f"{_PROFILES}."):
            _, kind, attr = key.split(".")
            profiles.setdefault(kind, {})[attr] = value
        else:
            fields[key] = value
    if profiles:
        current = {type_name(p.memory_type): p for p in client.get_settings().profiles}
        listed = []
        for kind, values in profiles.items():
            profile = memory_pb2.TypeProfile(memory_type=parse_type(kind))
            if kind in current:
                profile.CopyFrom(current[kind])
            for attr, number in values.items():
                setattr(profile, attr, number)
            listed.append(profile)
        fields[_PROFILES] = listed
    settings = client.update_settings(**fields)
    rows = _rows(settings)
    return settings, _table({key: rows[key] for key, _ in args.assignments})


def add_settings_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor settings get`` and ``calor settings set KEY=VALUE …``.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options (a parent, so ``--json`` may follow).
    """
    summary = "show or change the channel's settings: profiles, decay, gates, weights"
    settings = commands.add_parser("settings", parents=[shared], help=summary, description=summary)
    verbs = settings.add_subparsers(dest="settings_command", required=True, metavar="ACTION")

    def verb(name: str, handler: _Handler, text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, parents=[shared], help=text, description=text)
        sub.set_defaults(handler=handler)
        return sub

    verb("get", _get, "every setting of the channel, one KEY VALUE line each")
    change = verb(
        "set",
        _set,
        "change the settings named, in one update (all or nothing); print their new values",
    )
    change.add_argument(
        "assignments",
        nargs="+",
        type=parse_setting,
        metavar="KEY=VALUE",
        help="a setting and its value: cold_threshold=0.2, decay_mode=hybrid, "
        "gate_fidelity=true, dream_archive_exempt_types=semantic,core, "
        "profiles.fact.half_life_seconds=86400, …",
    )

"""The JSON Schema of what :func:`calor.client.to_dict` makes of a protobuf message.

``calor mcp`` declares each tool's ``outputSchema`` with it, so a host can check every
structured answer: fields by their proto names, every field without presence always
there, enums by name, timestamps as RFC 3339 text, maps as objects, nested messages under
``$defs`` (a message that holds itself stays one definition).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

__all__ = ["message_schema", "object_schema"]

_INTEGERS = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FIXED32,
}
# 64-bit integers come as numbers, or as text where a JSON number would lose digits.
_LONGS = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_FIXED64,
}
_WELL_KNOWN = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string"},
    "google.protobuf.FieldMask": {"type": "string"},
}


def message_schema(descriptor: Descriptor) -> dict[str, Any]:
    """The schema of one message's ``to_dict`` form, its nested messages under ``$defs``."""
    definitions: dict[str, dict[str, Any]] = {}
    schema = _object(descriptor, definitions)
    if definitions:
        schema["$defs"] = definitions
    return schema


def object_schema(properties: dict[str, Any], *nested: Descriptor) -> dict[str, Any]:
    """The schema of a plain object whose properties are all there, given as schemas, as
    message descriptors (their ``to_dict`` form), or as a list of one descriptor (an
    array of such messages)."""
    definitions: dict[str, dict[str, Any]] = {}

    def shown_as(value: Any) -> dict[str, Any]:
        if isinstance(value, Descriptor):
            return _reference(value, definitions)
        if isinstance(value, list):
            return {"type": "array", "items": _reference(value[0], definitions)}
        return dict(value)

    shown = {name: shown_as(value) for name, value in properties.items()}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": shown,
        "required": list(shown),
        "additionalProperties": False,
    }
    if definitions:
        schema["$defs"] = definitions
    return schema


def _object(descriptor: Descriptor, definitions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f.name: _field(f, definitions) for f in descriptor.fields},
        "required": [f.name for f in descriptor.fields if not f.has_presence],
        "additionalProperties": False,
    }


def _field(field: FieldDescriptor, definitions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        value = message.fields_by_name["value"]
        return {"type": "object", "additionalProperties": _single(value, definitions)}
    single = _single(field, definitions)
    return {"type": "array", "items": single} if field.is_repeated else single


def _single(field: FieldDescriptor, definitions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    kind = field.type
    if field.message_type is not None:
        return _reference(field.message_type, definitions)
    if field.enum_type is not None:
        return {"type": "string", "enum": [value.name for value in field.enum_type.values]}
    if kind in _INTEGERS:
        return {"type": "integer"}
    if kind in _LONGS:
        return {"type": ["integer", "string"]}
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return {"type": "number"}
    if kind == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    return {"type": "string"}  # string, and bytes as base64


def _reference(descriptor: Descriptor, definitions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    known = _WELL_KNOWN.get(descriptor.full_name)
    if known is not None:
        return dict(known)
    name = descriptor.full_name
    if name not in definitions:
        definitions[name] = {}  # claimed first: a message that holds itself refers back
        definitions[name] = _object(descriptor, definitions)
    return {"$ref": f"#/$defs/{name}"}

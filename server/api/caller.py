"""Who is calling: the API key a request was authenticated with, and what it may do.

Access control sets both once per call, before the servicer runs; servicers (grants),
limits (per-key rates) and the request log read them. A server running open has no
keys: every call's ``key_id`` is "" and its grants allow everything. Before access
control has looked at a call, its grants allow nothing.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

from calor.server.api.grants import NOTHING, Grants

__all__ = ["grants", "key_id", "set_grants", "set_key_id"]

_key_id: ContextVar[str] = ContextVar("calor_key_id", default="")
_grants: ContextVar[Grants] = ContextVar("calor_grants", default=NOTHING)


def key_id() -> str:
    """The id (never the secret) of the key the current call came with; "" when open."""
    return _key_id.get()


def set_key_id(value: str) -> Token[str]:
    """Name the current call's key (access control does, once it has checked it)."""
    return _key_id.set(value)


def grants() -> Grants:
    """What the current call's key may do: ``grants().allows(channel, permission)``."""
    return _grants.get()


def set_grants(value: Grants) -> Token[Grants]:
    """Say what the current call may do (access control does, with ``set_key_id``)."""
    return _grants.set(value)

"""Who is calling: the API key a request was authenticated with.

Access control sets it once per call, before the servicer runs; servicers (grants),
limits (per-key rates) and the request log read it. A server running open has no keys:
every call's ``key_id`` is "".
"""

from __future__ import annotations

from contextvars import ContextVar, Token

__all__ = ["key_id", "set_key_id"]

_key_id: ContextVar[str] = ContextVar("calor_key_id", default="")


def key_id() -> str:
    """The id (never the secret) of the key the current call came with; "" when open."""
    return _key_id.get()


def set_key_id(value: str) -> Token[str]:
    """Name the current call's key (access control does, once it has checked it)."""
    return _key_id.set(value)

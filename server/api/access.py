"""Access control: every call's API key, and the channels each RPC touches checked against
the key's grants before the servicer runs — for client streams, each message as it comes.

The rules are data: ``RULES`` maps each RPC to what it needs, read from its request.
What a request alone cannot tell (whose trigger an id names, which channels an empty
``Subscribe`` means) is checked where the data is, from ``caller.grants()``. Health and
reflection stay open. Keys are swapped by ``reload``: a stream whose key was revoked
ends UNAUTHENTICATED at once, one whose key's grants changed ends UNAVAILABLE (call
again: the new grants apply); every other stream goes on. A key past its ``expires``
(by the server's clock) is UNAUTHENTICATED from its next call, and its open streams end
UNAUTHENTICATED at their next message either way.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any, cast

import grpc
from google.protobuf.message import Message

from calor.server.api import caller
from calor.server.api.auth_file import ApiKey, KeyRing
from calor.server.api.decoding import HANDLER_KINDS
from calor.server.api.grants import EVERY_CHANNEL, EVERYTHING, Grants, Permission
from calor.server.clock import Clock, SystemClock

__all__ = ["OPEN_SERVICES", "RULES", "AccessControl", "Need", "loopback"]

log = logging.getLogger("calor.server.access")

READ, WRITE, ADMIN = Permission.READ, Permission.WRITE, Permission.ADMIN

Need = Callable[[Any], Iterable[tuple[str, Permission]]]
"""What an RPC's request (or each message of a client stream) needs: (channel, permission)
pairs. An empty channel is left to validation, or means "the granted ones" where the API
says so (``ListTriggers``, ``Subscribe``), checked by the servicer."""

if TYPE_CHECKING:  # generic only in the type stubs
    _Handler = grpc.RpcMethodHandler[Any, Any]

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Method-name prefixes any caller may use, key or none."""


def _own(permission: Permission) -> Need:
    return lambda r: [(r.channel, permission)]


def _recall(r: Any) -> list[tuple[str, Permission]]:
    return [(r.channel, READ), *((c, READ) for c in r.channels)]


def _evaluate(r: Any) -> list[tuple[str, Permission]]:
    return [(r.channel, READ), *([(r.channel, WRITE)] if r.store_findings else [])]


_M, _T, _S = "/calor.v1.MemoryService/", "/calor.v1.TriggerService/", "/calor.v1.SettingsService/"

RULES: dict[str, Need] = {
    _M + "Store": _own(WRITE),
    _M + "StoreStream": lambda r: [(r.store.channel, WRITE)],
    _M + "Recall": _recall,
    _M + "Inspect": _own(READ),
    _M + "ListMemories": _own(READ),
    _M + "Update": _own(WRITE),
    _M + "Keystone": _own(WRITE),
    _M + "Boost": _own(WRITE),
    _M + "Forget": _own(WRITE),
    _M + "Connect": _own(WRITE),
    _M + "Share": lambda r: [(r.channel, READ), (r.target_channel, WRITE)],
    _M + "Evaluate": _evaluate,
    _M + "EntityCard": _own(READ),
    _M + "Dream": _own(ADMIN),
    _M + "Offer": _own(WRITE),
    _M + "Context": _own(READ),
    _M + "Identity": _own(READ),
    _M + "Feedback": _own(WRITE),
    _M + "Export": _own(READ),
    _M + "Import": _own(WRITE),
    _M + "Tune": _own(ADMIN),
    _M + "DropChannel": _own(ADMIN),
    _M + "Progress": _own(WRITE),
    _M + "ListChannels": lambda r: [],  # the servicer lists the readable ones only
    _T + "CreateTrigger": lambda r: [(r.trigger.channel, ADMIN)],
    _T + "ListTriggers": _own(ADMIN),
    _T + "DeleteTrigger": _own(ADMIN),  # with no channel, trigger_service finds the
    _T + "TriggerHistory": _own(ADMIN),  # trigger among the caller's channels
    _T + "EvaluateTriggers": _own(ADMIN),
    _T + "TriggerFeedback": _own(WRITE),
    _T + "Subscribe": lambda r: [(c, READ) for c in r.channels],
    _S + "GetSettings": _own(READ),
    _S + "UpdateSettings": _own(ADMIN),
    _S + "ServerStatus": lambda r: [(EVERY_CHANNEL, ADMIN)],
}
"""What each RPC needs. An RPC missing here needs admin over every channel."""

_SERVER_WIDE: Need = lambda r: [(EVERY_CHANNEL, ADMIN)]  # noqa: E731


def loopback(host: str) -> bool:
    """Whether a bind address is reachable from this machine only (``localhost``,
    ``127.0.0.0/8``, ``::1``); any other name or address is taken as reachable."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _denial(need: Need, request: object, grants: Grants) -> str | None:
    """Why ``grants`` do not cover the request, or None when they do."""
    if not isinstance(request, Message):
        return None  # not decoded: the decoding layer inside refuses it
    for channel, permission in need(request):
        if channel and not grants.allows(channel, permission):
            if channel == EVERY_CHANNEL:
                return f"this key may not {permission.value} the whole server (admin on '*')"
            return f"this key may not {permission.value} channel {channel[:128]!r}"
    return None


def _expiry(key: ApiKey) -> str:
    """What an expired key's caller is told."""
    when = key.expires.astimezone(UTC).isoformat().replace("+00:00", "Z") if key.expires else ""
    return f"the API key {key.id} expired at {when}; it needs a new one (calor keys add)"


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    for name, value in metadata or ():
        if name == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


@dataclass(eq=False)
class _Session:
    """A streaming call in flight, ended early when its key is revoked, changed or
    expired."""

    key: ApiKey
    clock: Clock
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    status: tuple[grpc.StatusCode, str] = (grpc.StatusCode.OK, "")

    def end(self, code: grpc.StatusCode, message: str) -> None:
        self.status = (code, message)
        self.ended.set()

    def over(self) -> bool:
        """Whether the session has ended, ending it first if its key has expired."""
        if not self.ended.is_set() and self.key.expired(self.clock.now()):
            self.end(grpc.StatusCode.UNAUTHENTICATED, _expiry(self.key))
        return self.ended.is_set()


class AccessControl(grpc.aio.ServerInterceptor):
    """Checks every call's key, its expiry by ``clock`` and its grants; without keys
    (``None``) the server runs open."""

    def __init__(self, keys: KeyRing | None, clock: Clock | None = None) -> None:
        self._keys = keys
        self._clock: Clock = clock or SystemClock()
        self._sessions: set[_Session] = set()

    def reload(self, keys: KeyRing) -> None:
        """Serve these keys from the next call on; end the streams of revoked or expired
        keys (UNAUTHENTICATED) and of keys whose grants changed (UNAVAILABLE). Call it on
        the server's event loop."""
        self._keys = keys
        ended = 0
        for session in list(self._sessions):
            now = keys.keys.get(session.key.id)
            if now is None or now.sha256 != session.key.sha256:
                session.end(grpc.StatusCode.UNAUTHENTICATED, "the API key was revoked")
            elif now.grants != session.key.grants:
                session.end(grpc.StatusCode.UNAVAILABLE, "the API key's grants changed; call again")
            else:
                session.key = now  # a new expiry (or label) holds for the open stream too
                if not session.over():
                    continue
            ended += 1
        if ended:
            log.info("access control: ended %d streams of revoked, expired or changed keys", ended)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        method: str = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        if self._keys is None:
            caller.set_grants(EVERYTHING)  # one context per call: interceptors and servicer
            return await continuation(handler_call_details)
        token = _bearer(handler_call_details.invocation_metadata)
        key = self._keys.authenticate(token) if token else None
        expired = key is not None and key.expired(self._clock.now())
        if key is not None and not expired:  # named before the layers inside run
            caller.set_key_id(key.id)  # (limits count per key)
            caller.set_grants(key.grants)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if key is None:
            reason = "the API key is not valid" if token else "an API key is required"
            message = f"{reason} (send the metadata authorization: Bearer KEY)"
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, message)
        if expired:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, _expiry(key))
        need = RULES.get(method, _SERVER_WIDE)
        return _Guard(handler, need, key, self._sessions, self._clock).wrapped()


@dataclass(frozen=True)
class _Guard:
    """A handler behind the check of each request (or client-stream message) it reads."""

    handler: _Handler
    need: Need
    key: ApiKey
    sessions: set[_Session]
    clock: Clock

    def wrapped(self) -> _Handler:
        """A handler of the same kind that checks, then runs the original."""
        streams = (self.handler.request_streaming, self.handler.response_streaming)
        behaviour = {
            (False, False): self.unary,
            (False, True): self.server_stream,
            (True, False): self.client_stream,
            (True, True): self.bidirectional,
        }[streams]
        return _replace(self.handler, behaviour)

    @property
    def inner(self) -> Callable[..., Any]:
        """The original behaviour (whichever of the four kinds the handler has)."""
        h = self.handler
        return cast(
            Callable[..., Any], h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream
        )

    async def check(self, request: Any, context: Any) -> None:
        denial = _denial(self.need, request, self.key.grants)
        if denial is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, denial)

    async def checked(
        self, requests: AsyncIterator[Any], context: Any, session: _Session
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if session.over():
                await context.abort(*session.status)
            await self.check(request, context)
            yield request

    async def unary(self, request: Any, context: Any) -> Any:
        await self.check(request, context)
        return await self.inner(request, context)

    async def server_stream(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await self.check(request, context)
        with _open(self.sessions, self.key, self.clock) as session:
            responses = self.inner(request, context)
            async for response in _until_ended(responses, session, context):
                yield response

    async def client_stream(self, requests: AsyncIterator[Any], context: Any) -> Any:
        with _open(self.sessions, self.key, self.clock) as session:
            return await self.inner(self.checked(requests, context, session), context)

    def bidirectional(self, requests: AsyncIterator[Any], context: Any) -> Any:
        """None in the API today: each message is checked, the stream is not cut."""
        session = _Session(self.key, self.clock)
        return self.inner(self.checked(requests, context, session), context)


@contextmanager
def _open(sessions: set[_Session], key: ApiKey, clock: Clock) -> Iterator[_Session]:
    """A session of ``key`` for as long as its stream is open."""
    session = _Session(key, clock)
    sessions.add(session)
    try:
        yield session
    finally:
        sessions.discard(session)


async def _until_ended(responses: Any, session: _Session, context: Any) -> AsyncIterator[Any]:
    """The servicer's responses, until they end or the session does: then the call ends
    with the session's status, even while the servicer waits (an idle subscription). A
    response due after the key has expired is not sent: the call ends instead."""
    if inspect.isawaitable(responses):  # a servicer that writes with context.write()
        await responses
        return
    stream = aiter(responses)
    ended = asyncio.ensure_future(session.ended.wait())
    step: asyncio.Future[Any] | None = None
    try:
        while True:
            step = asyncio.ensure_future(_next(stream))
            await asyncio.wait({step, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                break
            try:
                response = step.result()
            except StopAsyncIteration:
                return
            step = None
            if session.over():
                break
            yield response
    finally:
        ended.cancel()
        if step is not None and not step.done():
            step.cancel()
            await asyncio.wait({step})
        if isinstance(stream, AsyncGenerator):
            await stream.aclose()
    await context.abort(*session.status)


async def _next(stream: AsyncIterator[Any]) -> Any:
    return await anext(stream)


def _replace(handler: _Handler, behaviour: Callable[..., Any], *, decode: bool = True) -> _Handler:
    """A handler of the same kind and serializer as ``handler`` that runs ``behaviour``;
    ``decode=False`` hands it the undecoded bytes."""
    kind = HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)]
    return kind(
        behaviour,
        request_deserializer=handler.request_deserializer if decode else None,
        response_serializer=handler.response_serializer,
    )


def _refusal(handler: _Handler, code: grpc.StatusCode, message: str) -> _Handler:
    """A handler of the same kind that ends the call with ``code`` without reading (or
    decoding) anything the caller sent."""

    async def refuse(request: Any, context: Any) -> None:
        await context.abort(code, message)

    return _replace(handler, refuse, decode=False)

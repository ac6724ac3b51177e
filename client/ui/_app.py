"""The inspector's web application: its routes, the gRPC client they share, and how a
refused call is shown."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import uvicorn
from asgi_csrf import asgi_csrf
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from calor.client._credentials import ChannelSecurity, open_aio_channel
from calor.client.aio import AsyncCalorClient
from calor.client.errors import (
    CalorClientError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from calor.client.ui import _pages
from calor.client.ui._actions import ACT_PATH, act, csrf_input
from calor.client.ui._events import event_stream

__all__ = ["UiOptions", "create_app", "serve"]

_HERE = Path(__file__).parent

# What a refused call shows as: the page's HTTP status.
_STATUS: tuple[tuple[type[CalorClientError], int], ...] = (
    (InvalidArgumentError, 400),
    (UnauthenticatedError, 401),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
)
_LOOPBACK = ("127.0.0.1", "localhost")
_RECALL_PATH = "/recall"


@dataclass(frozen=True)
class UiOptions:
    """How the inspector reaches its server, and what it may do there."""

    target: str = "localhost:50051"
    security: ChannelSecurity = field(default_factory=ChannelSecurity)
    """The API key every call carries and the TLS to speak."""
    allow_writes: bool = False
    """Whether a page may change anything: boost, pin or forget a memory, or recall and
    warm what it finds (each a form POST with a CSRF token)."""
    hosts: tuple[str, ...] = ("*",)
    """The host names its pages answer to; an inspector served on loopback answers only
    to loopback names, so a web page elsewhere cannot reach it by rebinding its DNS."""
    timeout: float = 10.0
    """Seconds each call to the server may take."""


def create_app(options: UiOptions) -> Starlette:
    """The inspector as an ASGI application; it opens its gRPC channel when served."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.globals["allow_writes"] = options.allow_writes
    templates.env.globals["target"] = options.target
    templates.env.globals["csrf_input"] = csrf_input

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_aio_channel(options.target, options.security) as channel:
            app.state.calor = AsyncCalorClient(
                options.target, timeout=options.timeout, grpc_channel=channel
            )
            app.state.templates = templates
            app.state.options = options
            yield

    async def refused(request: Request, error: Exception) -> Response:
        status = next((code for kind, code in _STATUS if isinstance(error, kind)), 502)
        return templates.TemplateResponse(
            request, "error.html", {"error": str(error), "status": status}, status_code=status
        )

    routes = [
        Route("/", _pages.fleet, name="fleet"),
        Route("/channels/{channel:path}/memories/{memory_id}", _pages.memory, name="memory"),
        Route("/channels/{channel:path}", _pages.channel, name="channel"),
        Route(_RECALL_PATH, _pages.recall, name="recall", methods=_recall_methods(options)),
        Route("/events", _pages.events, name="events"),
        Route("/events/stream", event_stream, name="event_stream"),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(options.hosts))]
    if options.allow_writes:
        routes.append(Route(ACT_PATH, act, name="act", methods=["POST"]))
        # Double-submit CSRF: a POST must echo the signed token its page's cookie holds.
        # The write paths are checked even without a cookie (the inspector holds its own
        # key: a cross-site form would carry none).
        middleware.append(
            Middleware(
                asgi_csrf,
                signing_secret=secrets.token_hex(32),
                always_protect={ACT_PATH, _RECALL_PATH},
            )
        )
    return Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={CalorClientError: refused, grpc.RpcError: refused},
    )


def _recall_methods(options: UiOptions) -> list[str]:
    """A peek is a GET; a recall that warms is a POST, taken only from a writer."""
    return ["GET", "POST"] if options.allow_writes else ["GET"]


def serve(options: UiOptions, *, host: str = "127.0.0.1", port: int = 8700) -> None:
    """Serve the inspector on ``host:port`` until interrupted."""
    if host in _LOOPBACK:
        options = dataclasses.replace(options, hosts=_LOOPBACK)
    uvicorn.run(create_app(options), host=host, port=port, log_level="warning")

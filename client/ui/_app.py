"""The inspector's web application: its routes, the gRPC client they share, and how a
refused call is shown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import uvicorn
from starlette.applications import Starlette
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


@dataclass(frozen=True)
class UiOptions:
    """How the inspector reaches its server, and what it may do there."""

    target: str = "localhost:50051"
    security: ChannelSecurity = field(default_factory=ChannelSecurity)
    """The API key every call carries and the TLS to speak."""
    allow_writes: bool = False
    """Whether a page may change anything (a recall that warms what it finds)."""
    timeout: float = 10.0
    """Seconds each call to the server may take."""


def create_app(options: UiOptions) -> Starlette:
    """The inspector as an ASGI application; it opens its gRPC channel when served."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.globals["allow_writes"] = options.allow_writes
    templates.env.globals["target"] = options.target

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
        Route("/recall", _pages.recall, name="recall"),
        Route("/events", _pages.events, name="events"),
        Route("/events/stream", event_stream, name="event_stream"),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={CalorClientError: refused, grpc.RpcError: refused},
    )


def serve(options: UiOptions, *, host: str = "127.0.0.1", port: int = 8700) -> None:
    """Serve the inspector on ``host:port`` until interrupted."""
    uvicorn.run(create_app(options), host=host, port=port, log_level="warning")

"""The inspector's writes, served only when it was started with ``allow_writes``: a
memory's boost, its keystone pin and unpin, its forgetting. Each is a form POST that
carries the page's CSRF token, and answers with the page that shows what it did."""

from __future__ import annotations

import grpc
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from calor.client.errors import InvalidArgumentError, NotFoundError
from calor.client.ui._pages import DONE, calor_of

__all__ = ["ACT_PATH", "act", "csrf_input"]

ACT_PATH = "/act"
"""Where every memory action posts (one fixed path, so the CSRF check covers it even for
a browser that sends no cookie)."""


def csrf_input(request: Request) -> Markup:
    """The hidden form field carrying this page's CSRF token (which a write must echo)."""
    token = request.scope["csrftoken"]()
    return Markup('<input type="hidden" name="csrftoken" value="{}">').format(token)


async def act(request: Request) -> Response:
    """Boost, pin, unpin or forget the memory the form names; then its page (or, once
    forgotten, its channel's) saying so."""
    form = await request.form()
    fields = {name: form.get(name) for name in ("action", "channel", "memory")}
    given = {name: value for name, value in fields.items() if isinstance(value, str) and value}
    if len(given) < len(fields) or given["action"] not in DONE:
        raise InvalidArgumentError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "a memory action needs its channel, its memory and one of: " + ", ".join(DONE),
        )
    action, channel, memory_id = given["action"], given["channel"], given["memory"]
    calor = calor_of(request)
    if action == "boost":
        await calor.boost(memory_id, channel=channel)
    elif action in ("keystone", "unkeystone"):
        await calor.keystone(memory_id, action == "keystone", channel=channel)
    elif not await calor.forget(memory_id, channel=channel):
        raise NotFoundError(
            grpc.StatusCode.NOT_FOUND, f"no memory {memory_id!r} in channel {channel!r}"
        )
    page = (
        request.url_for("channel", channel=channel)
        if action == "forget"
        else request.url_for("memory", channel=channel, memory_id=memory_id)
    )
    return RedirectResponse(f"{page}?done={action}", status_code=303)

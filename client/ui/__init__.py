"""``calor ui``: a local web inspector over any Calor server, a gRPC client of it.

It shows what its key may read (the server decides), and changes nothing unless it
was started with ``allow_writes``.
"""

from calor.client.ui._app import UiOptions, create_app, serve

__all__ = ["UiOptions", "create_app", "serve"]

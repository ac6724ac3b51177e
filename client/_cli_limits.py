"""`calor serve` flags for what one caller may take: message sizes, items per stream,
subscriptions and requests per key."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["add_limit_options", "limit_settings"]


def _at_least(low: float, kind: type[int] | type[float]) -> Callable[[str], Any]:
    """An argparse type: a finite number of ``kind``, at least ``low``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value

    return parse


def add_limit_options(serve: argparse.ArgumentParser) -> None:
    """Add the limit flags to ``calor serve``."""
    limits = serve.add_argument_group("limits (docs/operations.md: Limits)")
    limits.add_argument(
        "--max-message-bytes",
        type=_at_least(1024, int),
        metavar="N",
        help="largest message received or sent (default 16 MiB)",
    )
    limits.add_argument(
        "--max-stream-items",
        type=_at_least(1, int),
        metavar="N",
        help="most memories one StoreStream or Import brings (default 200000)",
    )
    limits.add_argument(
        "--max-subscriptions-per-key",
        type=_at_least(0, int),
        metavar="N",
        help="Subscribe streams one API key (open server: one host) holds open; 0: no cap "
        "(default 64)",
    )
    limits.add_argument(
        "--rate-per-key",
        type=_at_least(0, float),
        metavar="R",
        help="requests a second one API key (open server: one host) may make; 0: no limit "
        "(default 0)",
    )
    limits.add_argument(
        "--rate-burst",
        type=_at_least(1, float),
        metavar="N",
        help="requests a key may make at once before --rate-per-key applies "
        "(default: one second's worth)",
    )


def limit_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig fields the limit flags set (the flags not given are left out)."""
    from calor.server.config import Limits  # only `calor serve` loads server code

    given: dict[str, Any] = {
        "max_message_bytes": args.max_message_bytes,
        "max_subscriptions_per_key": args.max_subscriptions_per_key,
        "rate_per_key": args.rate_per_key,
        "rate_burst": args.rate_burst,
    }
    if args.max_stream_items is not None:
        given["limits"] = Limits(max_stream_items=args.max_stream_items)
    return {name: value for name, value in given.items() if value is not None}

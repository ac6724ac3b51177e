"""How the server's log lines look: one JSON object per line, or plain text for a terminal.

A record may carry structured fields (``extra={"fields": {...}}``, as the request log
does); JSON lines hold them as keys of their own, text lines append them as
``key=value``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

__all__ = ["LOG_FORMATS", "JsonFormatter", "TextFormatter", "configure_logging"]

LOG_FORMATS = ("auto", "json", "text")
"""``auto``: JSON unless stderr is a terminal (a person reading), then text."""

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the
    record's fields, and the traceback of an exception if there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _fields(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, with the record's fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{key}={value}" for key, value in _fields(record).items())
        if not fields:
            return text
        head, newline, rest = text.partition("\n")  # a traceback stays below the line
        return f"{head} {fields}{newline}{rest}"


def configure_logging(
    log_format: str = "auto",
    level: int = logging.INFO,
    stream: TextIO | None = None,
    force: bool = False,
) -> logging.Handler | None:
    """Send every log record at ``level`` and above to ``stream`` (stderr) in one format.

    Like :func:`logging.basicConfig`, it leaves alone a process that has set up its own
    logging already (a handler on the root logger), unless ``force``.

    Args:
        log_format: ``json``, ``text`` or ``auto`` (see :data:`LOG_FORMATS`).
        level: The root logger's level.
        stream: Where lines go; stderr by default.
        force: Replace the root logger's handlers if it has any.

    Returns:
        The handler installed on the root logger, or None when it was left alone.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    root = logging.getLogger()
    if root.handlers and not force:
        return None
    out = stream if stream is not None else sys.stderr
    if log_format == "auto":
        log_format = "text" if out.isatty() else "json"
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler

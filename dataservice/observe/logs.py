"""How every ``dataservice`` process writes its log: one JSON object per line
(``logging.format: json``, for log pipelines) or plain text for a terminal.

A JSON line holds ``ts`` (UTC, milliseconds), ``level``, ``logger``, ``msg``
and, for a request's line (:mod:`.requestlog`), its fields; an exception adds
``exc``, its traceback. Celery is told to leave logging as configured here,
so its own lines (and those of kombu, SQLAlchemy, Flower) come out the same
way, and the worker's start-up banner is replaced by a log line.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import IO, Any

from celery import signals

from dataservice.config.model import LoggingConfig
from dataservice.observe.lines import RequestLines

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        extra: dict[str, Any] = dict(fields) if isinstance(fields, dict) else {}
        if record.exc_info:
            extra["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            extra["exc"] = record.exc_text
        return json_line(record.created, record.levelname, record.name, record.getMessage(), extra)


class _Timestamps:
    """UTC to the millisecond, ``2026-12-01T18:30:02.114Z``; the seconds are
    formatted once a second (strftime per line showed in the profile). The
    second and its text are one tuple, replaced whole: threads share it, and
    two separate fields could pair one second's number with another's text."""

    __slots__ = ("_current",)

    def __init__(self) -> None:
        self._current: tuple[int, str] = (-1, "")

    def __call__(self, created: float) -> str:
        seconds = int(created)
        current = self._current
        if current[0] != seconds:
            current = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
            self._current = current
        return f"{current[1]}.{int((created - seconds) * 1000):03d}Z"


utc = _Timestamps()


def _leave_logging_alone(**_: Any) -> None:
    """A receiver of Celery's ``setup_logging``: having one, Celery configures nothing."""


class _Configured:
    """What :func:`configure_logging` set up last: the JSON handler request
    lines share, and their writer once a request has ended (processes that
    answer none, the change consumer or Flower, never start its thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handler: logging.StreamHandler[IO[str]] | None = None
        self.lines: RequestLines | None = None


_configured = _Configured()


def request_lines() -> RequestLines | None:
    """Where request lines go in batches, once JSON logging is configured here."""
    lines = _configured.lines
    if lines is not None or _configured.handler is None:
        return lines
    with _configured.lock:
        if _configured.lines is None and _configured.handler is not None:
            _configured.lines = RequestLines(_configured.handler)
        return _configured.lines


def stop_request_lines() -> None:
    """Write what waits and send request lines through ``logging`` again."""
    with _configured.lock:
        lines, _configured.lines, _configured.handler = _configured.lines, None, None
    if lines is not None:
        lines.close()


# Built once: json.dumps with options builds an encoder per call, and a
# request's line is written on every request.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)


def json_line(created: float, level: str, logger: str, msg: str, fields: dict[str, Any]) -> str:
    """One log line as JSON: ``ts``, ``level``, ``logger``, ``msg``, then ``fields``."""
    line = {"ts": utc(created), "level": level, "logger": logger, "msg": msg, **fields}
    return _ENCODER.encode(line)


def configure_logging(
    config: LoggingConfig, level: str = "INFO", stream: IO[str] | None = None
) -> None:
    """The root logger writes ``config.format`` lines to ``stream`` (stderr);
    with JSON, request lines go to the same stream in batches (:mod:`.lines`)."""
    stop_request_lines()
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = JsonFormatter() if config.format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Warnings (Celery's about running as root, say) as log lines, not bare text.
    logging.captureWarnings(True)
    signals.setup_logging.connect(_leave_logging_alone, weak=False)
    if config.format == "json":
        _configured.handler = handler

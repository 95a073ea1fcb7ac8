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
import time
from typing import IO, Any

from celery import signals

from dataservice.config import LoggingConfig

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line, separators=(",", ":"), ensure_ascii=False, default=str)


def _utc(created: float) -> str:
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + (
        f".{int((created - seconds) * 1000):03d}Z"
    )


def _leave_logging_alone(**_: Any) -> None:
    """A receiver of Celery's ``setup_logging``: having one, Celery configures nothing."""


def configure_logging(
    config: LoggingConfig, level: str = "INFO", stream: IO[str] | None = None
) -> None:
    """The root logger writes ``config.format`` lines to ``stream`` (stderr)."""
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

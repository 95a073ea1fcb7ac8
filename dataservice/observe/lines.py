"""Request lines, written in batches.

A line per request is the one log line on the hot path: through ``logging``
(a record, the handler's lock, a write and a flush per line) it cost a cached
hit a fifth of its worker CPU. Here each line is its JSON text appended to a
buffer, and a thread of its own writes the buffer to the log's stream every
``INTERVAL_S`` (or once it holds ``MAX_LINES``), under the log handler's own
lock, so lines never interleave with the other log lines. At most one
interval of lines is lost if the process is killed; a normal exit writes them.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import IO

INTERVAL_S = 0.2
MAX_LINES = 2000


class RequestLines:
    def __init__(self, handler: logging.StreamHandler[IO[str]]) -> None:
        self._handler = handler
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="request-lines", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def write(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
            full = len(self._lines) >= MAX_LINES
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        if not lines:
            return
        handler = self._handler
        handler.acquire()
        try:
            handler.stream.write("\n".join(lines) + "\n")
            handler.stream.flush()
        except (OSError, ValueError):
            # A closed or broken stream: the lines go, the request does not wait.
            pass
        finally:
            handler.release()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.flush()

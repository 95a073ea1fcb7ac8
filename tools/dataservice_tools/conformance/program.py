"""The caller program under test: started, driven by lines on its standard
input, read by lines on its standard output (docs/conformance.md)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from dataservice_tools.conformance.interface import (
    CallerInterfaceError,
    Hello,
    Outcome,
    dumps,
    loads,
)

# How long a caller may take to connect and say it is ready.
READY_TIMEOUT_S = 30.0
# Beyond a call's own deadline, how long its result may take to come back:
# the caller's last wait ends at the deadline, and its line follows.
RESULT_SLACK_S = 5.0


class CallerProgram:
    """One running caller program. Calls are sent as lines; a reader thread
    files each result line under its call's id."""

    def __init__(self, command: str, env: dict[str, str] | None = None) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise CallerInterfaceError("the caller command is empty")
        try:
            self._process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                encoding="utf-8",
                # A line that is not UTF-8 is a broken line, not a dead reader.
                errors="replace",
                bufsize=1,
                # Its own process group: a program that runs others (a shell
                # script, npx) is stopped with everything it started.
                start_new_session=True,
            )
        except OSError as exc:
            raise CallerInterfaceError(f"cannot start {self.argv[0]!r}: {exc}") from None
        self._ids = itertools.count(1)
        self._lines: dict[str, dict[str, Any]] = {}
        self._ready: dict[str, Any] | None = None
        self._broken = ""
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,))
        self._reader.daemon = True
        self._reader.start()
        self.name = self.argv[0]

    def _read(self, stdout: IO[str]) -> None:
        try:
            for text in stdout:
                if not text.strip():
                    continue
                line = loads(text)
                with self._arrived:
                    if line.get("type") == "ready":
                        self._ready = line
                    elif line.get("type") == "result":
                        self._lines[str(line.get("id"))] = line
                    else:
                        raise CallerInterfaceError(
                            f"unexpected line from the caller: {text[:200]!r}"
                        )
                    self._arrived.notify_all()
        except CallerInterfaceError as exc:
            self._broken = str(exc)
        except (OSError, ValueError) as exc:
            self._broken = f"its output could not be read ({exc})"
        with self._arrived:
            self._broken = self._broken or "the caller closed its standard output"
            self._arrived.notify_all()

    def _send(self, line: dict[str, Any]) -> None:
        stdin = self._process.stdin
        if stdin is None:
            raise CallerInterfaceError("the caller's standard input is closed")
        try:
            stdin.write(dumps(line) + "\n")
            stdin.flush()
        except (BrokenPipeError, ValueError):
            raise CallerInterfaceError(self._exited("stopped reading its standard input")) from None

    def _exited(self, what: str) -> str:
        code = self._process.poll()
        return f"the caller {what}" + ("" if code is None else f" (exit status {code})")

    def hello(self, hello: Hello, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Say where the service is; wait for the caller to say it is ready."""
        self._send(hello.line())
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while self._ready is None:
                if self._broken:
                    raise CallerInterfaceError(self._exited(f"did not say ready: {self._broken}"))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CallerInterfaceError(
                        f"the caller did not say ready within {timeout_s:.0f} s"
                    )
                self._arrived.wait(left)
            self.name = str(self._ready.get("name") or self.name)

    def calls(self, calls: Sequence[dict[str, Any]]) -> list[Outcome]:
        """Send every call at once, then take each one's result (the caller
        may answer them in any order)."""
        ids = [str(next(self._ids)) for _ in calls]
        longest_s = max((call["timeout_ms"] for call in calls), default=0) / 1000
        for call_id, call in zip(ids, calls, strict=True):
            self._send({"type": "call", "id": call_id, **call})
        deadline = time.monotonic() + longest_s + RESULT_SLACK_S
        with self._arrived:
            while not all(call_id in self._lines for call_id in ids):
                if self._broken:
                    raise CallerInterfaceError(self._exited(f"stopped answering: {self._broken}"))
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [i for i in ids if i not in self._lines]
                    raise CallerInterfaceError(
                        f"no result for call(s) {', '.join(missing)} within their deadline "
                        f"plus {RESULT_SLACK_S:.0f} s"
                    )
                self._arrived.wait(left)
            return [Outcome.parse(self._lines.pop(call_id)) for call_id in ids]

    def call(self, call: dict[str, Any]) -> Outcome:
        return self.calls([call])[0]

    def close(self, timeout_s: float = 10.0) -> None:
        """Close its standard input, and wait for it to exit (killed if it does not)."""
        if self._process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout_s)
        # Whatever it started goes too: until then its output stays open.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._reader.join(timeout_s)
        if self._process.stdout is not None and not self._reader.is_alive():
            self._process.stdout.close()

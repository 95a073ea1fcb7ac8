"""The one wait on a condition: :func:`eventually`.

Tests, benches and the private services wait for something another process does
(a worker answers, a key appears, a lease changes hands). Each such wait polls
one condition until it holds or its time is up, and then fails naming what it
waited for, never a bare "timed out". A fixed sleep stands in for none of them.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    condition: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str | Callable[[], str] = "",
) -> T:
    """``condition()``'s first truthy value, polled every ``interval`` seconds.

    The last poll starts once ``timeout`` seconds have passed; if it too is
    falsy, AssertionError names what was awaited (``message``, else the
    condition: a lambda by its source line) and the last value seen. A callable
    ``message`` is called only then, for what a failure alone needs (a log's tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        last = time.monotonic() >= deadline
        value = condition()
        if value:
            return value
        if last:
            break
        time.sleep(interval)
    what = message() if callable(message) else message or _named(condition)
    raise AssertionError(f"waited {timeout:g} s for {what}; last seen: {value!r}")


def _named(condition: Callable[[], object]) -> str:
    """A lambda by its source line, anything else by its name."""
    name = getattr(condition, "__qualname__", repr(condition))
    if name.endswith("<lambda>"):
        try:
            return inspect.getsource(condition).strip()
        except (OSError, TypeError):
            pass
    return name

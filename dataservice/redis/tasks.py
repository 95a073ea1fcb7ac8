"""Tasks that talk to Redis on asyncio, and how they are stopped."""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)


async def stop_task(task: asyncio.Task[None], within_s: float, name: str) -> None:
    """Cancel ``task`` and wait (``within_s`` at most) until it has ended.

    Cancelled again every 20 ms: redis-py may swallow a cancellation (in a
    read about to time out), and the task stops at its next step anyway."""
    until = time.monotonic() + within_s
    while not task.done() and time.monotonic() < until:
        task.cancel()
        await asyncio.wait({task}, timeout=0.02)
    if task.done() and not task.cancelled():
        error = task.exception()
        if error is not None:
            log.warning("%s failed: %s", name, type(error).__name__)

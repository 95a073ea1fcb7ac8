"""``dataservice changes``: the change consumer, in the foreground."""

from __future__ import annotations

import logging
import signal
from types import FrameType


def changes() -> None:
    """Tail the database's binlog and invalidate both cache formats for every
    change to a record (docs/changes.md). One consumer is active across all
    that run; the others stand by and take over when it stops."""
    # Imported here: dataservice.cli imports this module to register the command.
    from dataservice.changes.consumer import ChangeConsumer
    from dataservice.cli import _load

    settings, config = _load()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    consumer = ChangeConsumer(settings, config)

    def stop(signum: int, frame: FrameType | None) -> None:
        consumer.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        consumer.run()
    finally:
        consumer.close()

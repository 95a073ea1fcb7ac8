"""Where an active spell of the change consumer starts reading.

The saved position, if the server still has its binlog file. Otherwise
(nothing saved, or the file purged) changes may have gone unseen: the
consumer says so in the log, rotates the cache's generation, and starts from
the server's current position, saved at once.
"""

from __future__ import annotations

import logging
from typing import Protocol

from sqlalchemy import text

from dataservice.changes.checkpoint import Checkpoints
from dataservice.changes.lease import Lease
from dataservice.changes.server import check_server
from dataservice.changes.stream import Position

log = logging.getLogger(__name__)

# Who the audit log names for a rotation the consumer makes.
WHO = "change-consumer"


class Rotates(Protocol):
    """Whatever rotates the caches the consumer keeps (every cell's)."""

    def rotate(self, who: str) -> object: ...


def start_position(
    token: int,
    url: str,
    server_id: int,
    lease: Lease,
    checkpoints: Checkpoints,
    controls: Rotates,
) -> Position:
    saved = checkpoints.load()
    lease.outrank(token, checkpoints.highest_token())
    # The server's own check also says where its binlog is now, in whichever
    # spelling the server takes (MySQL 8.4 has no SHOW MASTER STATUS).
    head = check_server(url, replica_server_id=server_id)
    with checkpoints.engine.connect() as conn:
        logs = {row[0] for row in conn.execute(text("SHOW BINARY LOGS"))}
    if saved is not None and saved.log_file in logs:
        return saved
    if saved is None:
        log.error("no saved binlog position: changes before now are unknown; rotating the cache")
    else:
        log.error(
            "the saved binlog position (%s) is no longer on the server (purged): "
            "changes since are unknown; rotating the cache",
            saved,
        )
    controls.rotate(WHO)
    position = Position(head.log_file, head.log_pos)
    checkpoints.save(position, token)
    return position

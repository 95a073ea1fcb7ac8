"""Where the change stream has got to, saved in the database itself.

A position is saved only after every invalidation it covers was applied, so
a consumer that restarts replays (invalidations are idempotent) rather than
skips. A save carries the consumer's fencing token and is ignored when a
newer token has saved already: a deposed consumer cannot move the position.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine, select, text

from dataservice.changes.stream import Position
from dataservice.store.schema import change_positions

STREAM = "records"

# One statement, whatever the row's state: the assignments run left to right,
# so the token is compared before it is replaced.
_SAVE = text(
    "INSERT INTO change_positions (stream, log_file, log_pos, fencing_token, updated_at)"
    " VALUES (:stream, :log_file, :log_pos, :token, :now)"
    " ON DUPLICATE KEY UPDATE"
    " log_file = IF(:token >= fencing_token, VALUES(log_file), log_file),"
    " log_pos = IF(:token >= fencing_token, VALUES(log_pos), log_pos),"
    " updated_at = IF(:token >= fencing_token, VALUES(updated_at), updated_at),"
    " fencing_token = GREATEST(fencing_token, :token)"
)


class Checkpoints:
    def __init__(self, engine: Engine, stream: str = STREAM) -> None:
        self._engine = engine
        self._stream = stream

    @property
    def engine(self) -> Engine:
        return self._engine

    def load(self) -> Position | None:
        query = select(change_positions.c.log_file, change_positions.c.log_pos).where(
            change_positions.c.stream == self._stream
        )
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        return Position(row.log_file, int(row.log_pos)) if row else None

    def highest_token(self) -> int:
        """The largest fencing token a position was saved with (0: none yet)."""
        query = select(change_positions.c.fencing_token).where(
            change_positions.c.stream == self._stream
        )
        with self._engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def save(self, position: Position, token: int) -> None:
        params = {
            "stream": self._stream,
            "log_file": position.log_file,
            "log_pos": position.log_pos,
            "token": token,
            "now": datetime.now(UTC).replace(tzinfo=None),
        }
        with self._engine.begin() as conn:
            conn.execute(_SAVE, params)

"""Where a read finds its records: the seam between the operations and what
stands behind them, the database (:class:`~dataservice.handler.operations.DatabaseSource`)
or the cache in front of it (:class:`dataservice.cache.CachedSource`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from dataservice.enums import ReadMode
from dataservice.proto import pb
from dataservice.refusals import Refusal

# A read_many's outcome for one key: the record, None (no such record), or
# why it could not be read.
Found = dict[tuple[str, str], "pb.Record | Refusal | None"]


class RecordSource(Protocol):
    """Where a read finds a record, within the request's deadline."""

    def read(
        self,
        scope: str,
        object_id: str,
        mode: ReadMode,
        deadline_ms: int,
        request_id: str,
        issued_ms: int | None = None,
    ) -> pb.Record | None:
        """``issued_ms``: when the request was sent (the caller's signed clock)."""
        ...

    def read_many(
        self,
        keys: Sequence[tuple[str, str]],
        mode: ReadMode,
        deadline_ms: int,
        request_id: str,
        issued_ms: int | None = None,
    ) -> Found:
        """Each of ``keys`` (distinct ``(scope, object_id)`` pairs) read at once."""
        ...

    def changed(self, scope: str, object_id: str, revision: int, *, deleted: bool) -> None:
        """A mutation committed (``revision``: the new one, or the one deleted)."""

    def changed_many(self, changes: Sequence[tuple[str, str, int, bool]]) -> None:
        """:meth:`changed` for each ``(scope, object_id, revision, deleted)`` of a batch."""

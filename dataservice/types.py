"""Values the client returns and the operations a batch submits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dataservice.enums import ReadMode
from dataservice.errors import RequestError


@dataclass(frozen=True, slots=True)
class Record:
    object_id: str
    revision: int
    payload: bytes
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class WriteResult:
    object_id: str
    revision: int
    created: bool


@dataclass(frozen=True, slots=True)
class DeleteResult:
    object_id: str
    revision: int


@dataclass(frozen=True, slots=True)
class Page:
    records: tuple[Record, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class ReadMany:
    """The answers to a :class:`ReadManyOp`, in its order: each read's record,
    or the error it would have raised alone (``NotFound``, ``PermissionDenied``, ...)."""

    results: tuple[Record | RequestError, ...]


@dataclass(frozen=True, slots=True)
class ReadOp:
    scope: str
    object_id: str
    mode: ReadMode = ReadMode.ALLOW_CACHED


@dataclass(frozen=True, slots=True)
class WriteOp:
    scope: str
    object_id: str
    payload: bytes
    idempotency_key: str | None = None
    # 0: unconditional; otherwise applied only at exactly this revision (else Conflict).
    expected_revision: int = 0


@dataclass(frozen=True, slots=True)
class DeleteOp:
    scope: str
    object_id: str
    idempotency_key: str | None = None
    expected_revision: int = 0


@dataclass(frozen=True, slots=True)
class ListOp:
    scope: str
    page_size: int = 0
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class ReadManyOp:
    """Many reads in one message (``Client.read_many``): each authorised and
    answered on its own, the answers together."""

    reads: tuple[ReadOp, ...]


Operation = ReadOp | WriteOp | DeleteOp | ListOp | ReadManyOp
Result = Record | WriteResult | DeleteResult | Page | ReadMany

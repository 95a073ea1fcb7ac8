"""The closed sets of names every part of the service shares."""

from __future__ import annotations

import enum
from enum import StrEnum

from dataservice.proto import pb


class LaneName(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class OperationClass(StrEnum):
    """What a statement costs the database, for permit accounting."""

    POINT_READ = "point_read"
    POINT_WRITE = "point_write"
    BOUNDED_LIST = "bounded_list"


class StatusCode(enum.IntEnum):
    """The service's status codes; values equal the ``access.v2.StatusCode`` wire values."""

    OK = pb.STATUS_CODE_OK
    INVALID_ARGUMENT = pb.STATUS_CODE_INVALID_ARGUMENT
    UNAUTHENTICATED = pb.STATUS_CODE_UNAUTHENTICATED
    PERMISSION_DENIED = pb.STATUS_CODE_PERMISSION_DENIED
    NOT_FOUND = pb.STATUS_CODE_NOT_FOUND
    CONFLICT = pb.STATUS_CODE_CONFLICT
    RESOURCE_EXHAUSTED = pb.STATUS_CODE_RESOURCE_EXHAUSTED
    DEADLINE_EXCEEDED = pb.STATUS_CODE_DEADLINE_EXCEEDED
    UNAVAILABLE = pb.STATUS_CODE_UNAVAILABLE
    INTERNAL = pb.STATUS_CODE_INTERNAL

    @property
    def retryable(self) -> bool:
        return self in (StatusCode.RESOURCE_EXHAUSTED, StatusCode.UNAVAILABLE)


class ReadMode(enum.IntEnum):
    """How fresh a read must be."""

    ALLOW_CACHED = pb.READ_MODE_ALLOW_CACHED
    PRIMARY = pb.READ_MODE_PRIMARY


class CacheFormat(StrEnum):
    """A cached record's encoding: v1 JSON, v2 protobuf (``docs/cache.md``)."""

    V1 = "v1"
    V2 = "v2"

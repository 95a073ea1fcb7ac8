"""dataservice: bounded record access to one MySQL database through Celery lanes.

The public API is what this module exports; everything else is internal.
"""

from dataservice.client import AsyncClient, AsyncHandle, Client, Handle
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode, StatusCode
from dataservice.errors import (
    ConfigError,
    Conflict,
    DataServiceError,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RequestError,
    RequestLost,
    ResourceExhausted,
    ResultNotReady,
    RetryableError,
    ServiceSetupError,
    Unauthenticated,
    Unavailable,
)
from dataservice.types import (
    DeleteOp,
    DeleteResult,
    ListOp,
    Operation,
    Page,
    ReadMany,
    ReadManyOp,
    ReadOp,
    Record,
    WriteOp,
    WriteResult,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncHandle",
    "Client",
    "Config",
    "ConfigError",
    "Conflict",
    "DataServiceError",
    "DeadlineExceeded",
    "DeleteOp",
    "DeleteResult",
    "Handle",
    "InternalError",
    "InvalidArgument",
    "LaneName",
    "ListOp",
    "NotFound",
    "Operation",
    "Page",
    "PermissionDenied",
    "ReadMany",
    "ReadManyOp",
    "ReadMode",
    "ReadOp",
    "Record",
    "RequestError",
    "RequestLost",
    "ResourceExhausted",
    "ResultNotReady",
    "RetryableError",
    "ServiceSetupError",
    "Settings",
    "StatusCode",
    "Unauthenticated",
    "Unavailable",
    "WriteOp",
    "WriteResult",
    "__version__",
    "load_config",
]

"""The public surface of the package is deliberate: this test pins it."""

from __future__ import annotations

import dataservice
from dataservice import errors


def test_public_api_is_pinned() -> None:
    assert sorted(dataservice.__all__) == sorted(
        [
            "AsyncClient", "AsyncHandle", "Client", "Config", "ConfigError", "Conflict",
            "DataServiceError", "DeadlineExceeded",
            "DeleteOp", "DeleteResult", "Handle", "InternalError", "InvalidArgument", "LaneName",
            "ListOp", "NotFound", "Operation", "Page", "PermissionDenied", "ReadMany",
            "ReadManyOp", "ReadMode", "ReadOp",
            "Record", "RequestError", "RequestLost", "ResourceExhausted", "ResultNotReady",
            "RetryableError",
            "ServiceSetupError",
            "Settings", "StatusCode", "Unauthenticated", "Unavailable", "WriteOp", "WriteResult",
            "__version__", "load_config",
        ]
    )  # fmt: skip
    for name in dataservice.__all__:
        assert hasattr(dataservice, name), name


def test_every_error_shares_one_root_and_retryable_errors_share_a_branch() -> None:
    error_classes = [
        obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, Exception)
    ]
    assert all(issubclass(cls, errors.DataServiceError) for cls in error_classes)
    assert issubclass(errors.ResourceExhausted, errors.RetryableError)
    assert issubclass(errors.Unavailable, errors.RetryableError)
    assert issubclass(errors.RequestLost, errors.Unavailable)
    assert not issubclass(errors.InvalidArgument, errors.RetryableError)


def test_every_status_code_maps_to_its_typed_error() -> None:
    for code in dataservice.StatusCode:
        if code is dataservice.StatusCode.OK:
            continue
        error = errors.error_for(code, "message", retry_after=0.25)
        assert error.code is code
        assert isinstance(error, errors.RequestError)
        if code.retryable:
            assert isinstance(error, errors.RetryableError)
            assert error.retry_after == 0.25


def test_no_celery_types_in_the_public_api() -> None:
    for name in dataservice.__all__:
        obj = getattr(dataservice, name)
        assert "celery" not in getattr(obj, "__module__", "")
        assert "kombu" not in getattr(obj, "__module__", "")

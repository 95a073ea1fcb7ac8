"""Every exception class the package defines descends from one root, and the
tree drawn in ``dataservice/errors.py`` is the tree the code has."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import typing

import dataservice_tools

import dataservice
from dataservice.enums import StatusCode
from dataservice.errors import DataServiceError
from dataservice.refusals import Reason, Refusal


def _modules() -> list[str]:
    names = []
    for package in (dataservice, dataservice_tools):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if not info.name.endswith("_pb2"):
                names.append(info.name)
    return names


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return found


def test_every_exception_class_has_the_one_root() -> None:
    exceptions = _defined_exceptions()
    assert len(exceptions) > 20
    outside = sorted(
        name for name, cls in exceptions.items() if not issubclass(cls, DataServiceError)
    )
    assert not outside, f"exception classes outside DataServiceError: {outside}"


def test_the_drawn_tree_is_the_code() -> None:
    drawn = set(re.findall(r"[├└]── (\w+)", dataservice.errors.__doc__ or ""))
    defined = {cls.__name__ for cls in _defined_exceptions().values()}
    assert drawn | {DataServiceError.__name__} == defined
    refusals = {cls.__name__ for cls in _defined_exceptions().values() if issubclass(cls, Refusal)}
    tree = (dataservice.errors.__doc__ or "").split("└── Refusal", 1)[1]
    assert set(re.findall(r"[├└]── (\w+)", tree)) == refusals - {"Refusal"}


def test_every_refusal_has_a_row_in_the_failures_table() -> None:
    from dataservice.handler import failures

    refusals = [cls for cls in _defined_exceptions().values() if issubclass(cls, Refusal)]
    unmapped = sorted(
        cls.__name__
        for cls in refusals
        if cls is not Refusal and not any(k in failures._TABLE for k in cls.__mro__)
    )
    assert not unmapped, f"refusals the failures table does not answer: {unmapped}"
    # And every refusal reason has a code.
    assert set(failures.REASON_CODES) == set(dataservice.refusals.Reason)


def test_every_retryable_refusal_is_answered_with_a_reason() -> None:
    """A caller told to come back is told why, and the rejection counter
    counts it under a reason: a retryable row names its reason, or takes the
    refusal's own, which the refusal's type then requires."""
    from dataservice.handler import failures

    unsaid = []
    for kind, (answer, _message, _retry_after_ms) in failures._TABLE.items():
        if isinstance(answer, StatusCode):
            if answer.retryable:
                unsaid.append(f"{kind.__name__} is answered {answer.name} without a reason")
        elif answer is None and typing.get_type_hints(kind).get("reason") is not Reason:
            unsaid.append(f"{kind.__name__} takes its own reason, which it may not have")
    assert not unsaid, unsaid
    for reason in {a for a, _, _ in failures._TABLE.values() if isinstance(a, Reason)}:
        assert failures.REASON_CODES[reason].retryable, f"{reason} answers a final code"

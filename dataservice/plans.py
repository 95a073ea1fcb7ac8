"""Plans: code that does no I/O, written once for blocking and asyncio callers.

A plan is a generator. It yields *steps* (objects with ``run(context)``,
which blocks, and ``arun(context)``, which is awaited) and is sent back what
each step gave, or has the step's error thrown into it, until it returns.
:class:`Driver` runs a plan either way; the plan's own ``try``, ``except``
and ``finally`` decide what an error means, a cancellation included.
The clients' calls (:mod:`dataservice.client.calls`) and the publish on
RabbitMQ (:mod:`dataservice.broker.rabbitmq`) are plans.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar

R = TypeVar("R")


class Step(Protocol):
    """One thing a plan needs done, against the driver's ``context``."""

    def run(self, context: Any) -> Any: ...

    async def arun(self, context: Any) -> Any: ...


class Driver(Generic[R]):
    """Runs one plan: hands it each step's value, or throws in its error,
    until it returns."""

    def __init__(self, plan: Generator[Any, Any, R]) -> None:
        self._plan = plan
        self._value: Any = None
        self._error: BaseException | None = None
        self._result: Any = None

    def __iter__(self) -> Iterator[Step]:
        while True:
            value, error, self._value, self._error = self._value, self._error, None, None
            try:
                step = self._plan.send(value) if error is None else self._plan.throw(error)
            except StopIteration as done:
                self._result = done.value
                return
            yield step

    @contextmanager
    def outcome(self) -> Iterator[None]:
        """What the block raises goes to the plan, not up."""
        try:
            yield
        except BaseException as exc:
            self._error = exc

    def run(self, context: Any) -> R:
        """Every step, blocking."""
        for step in self:
            with self.outcome():
                self._value = step.run(context)
        return self._result  # type: ignore[no-any-return]

    async def arun(self, context: Any) -> R:
        """Every step, awaited."""
        for step in self:
            with self.outcome():
                self._value = await step.arun(context)
        return self._result  # type: ignore[no-any-return]

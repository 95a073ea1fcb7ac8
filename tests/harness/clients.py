"""Both clients behind one sync-looking face, so that one suite checks the
contract they share (retries, throttle, deadlines, idempotency, errors,
batch handles) against each.

:class:`DrivenAsyncClient` runs a real :class:`~dataservice.AsyncClient` on an
event loop of its own thread; the test's thread waits for each call. Only
the calling is adapted: the client, its transport, its handles and its
errors are the real ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, Literal, TypeVar

from dataservice import AsyncClient, AsyncHandle, Client, Handle
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError
from dataservice.types import Operation, Result

T = TypeVar("T")
ClientKind = Literal["sync", "async"]
KINDS: tuple[ClientKind, ...] = ("sync", "async")


class DrivenHandle:
    """An :class:`AsyncHandle` whose ``result`` the test's thread waits for."""

    def __init__(self, driver: DrivenAsyncClient, handle: AsyncHandle) -> None:
        self._driver = driver
        self.inner = handle

    def result(self, timeout: float | None = None) -> Result:
        return self._driver.run(self.inner.result(timeout))

    def done(self) -> bool:
        return self.inner.done()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class DrivenAsyncClient:
    """An :class:`AsyncClient` called as a :class:`Client` is."""

    def __init__(self, caller: str, settings: Settings, config: Config, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="driven-async-client", daemon=True
        )
        self._thread.start()
        self.inner = AsyncClient(caller, settings, config, **kwargs)
        self.caller = caller
        self.config = config

    @property
    def _transport(self) -> Any:
        return self.inner._transport

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        """Await ``call`` on the client's loop."""
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def read(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.inner.read(*args, **kwargs))

    def read_many(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.inner.read_many(*args, **kwargs))

    def write(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.inner.write(*args, **kwargs))

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.inner.delete(*args, **kwargs))

    def list(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.inner.list(*args, **kwargs))

    def submit(self, operation: Operation, **kwargs: Any) -> DrivenHandle:
        return DrivenHandle(self, self.run(self.inner.submit(operation, **kwargs)))

    def submit_many(self, operations: Iterable[Operation], **kwargs: Any) -> list[DrivenHandle]:
        handles = self.run(self.inner.submit_many(operations, **kwargs))
        return [DrivenHandle(self, handle) for handle in handles]

    def results(self, handles: Sequence[DrivenHandle]) -> list[Result | DataServiceError]:
        return self.run(self.inner.results([handle.inner for handle in handles]))

    def close(self) -> None:
        try:
            self.run(self.inner.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def __enter__(self) -> DrivenAsyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


AnyClient = Client | DrivenAsyncClient
AnyHandle = Handle | DrivenHandle


def make_client(
    kind: ClientKind, caller: str, settings: Settings, config: Config, **kwargs: Any
) -> AnyClient:
    if kind == "sync":
        return Client(caller, settings, config, **kwargs)
    return DrivenAsyncClient(caller, settings, config, **kwargs)

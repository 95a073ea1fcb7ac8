"""The caller's API for asyncio services: :class:`Client`'s calls, awaited.

The same calls as :class:`~dataservice.Client`, written once (:mod:`.calls`):
the same signing, deadlines, retries, throttle, idempotency and errors; only
the waiting differs. A process's calls share one reply channel read by one
task, and at most two publishing connections, however many are in flight: a
few thousand awaiting coroutines cost a few thousand events, not connections
or threads.

An ``AsyncClient`` belongs to the event loop that first uses it. Close it
with ``await client.aclose()`` or ``async with``.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from dataservice.client.async_transport import AsyncTransport
from dataservice.client.calls import Awaited
from dataservice.client.handle import AsyncHandle, gather_async
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError
from dataservice.security.callers import CallerKey
from dataservice.types import Result


class AsyncClient(Awaited[AsyncHandle]):
    """A caller of the data service, for asyncio.

    As :class:`~dataservice.Client`: ``read``, ``read_many``, ``write``,
    ``delete`` and ``list`` run on the interactive lane and are awaited;
    ``submit`` and ``submit_many`` enqueue on the batch lane and return
    :class:`AsyncHandle` objects whose ``result`` is awaited. Cancelling a
    call stops its wait and nothing else.
    """

    _transport: AsyncTransport

    def __init__(
        self, caller: str, settings: Settings, config: Config, *, key: CallerKey | None = None
    ) -> None:
        """``key`` signs the requests; by default, the caller's first key in the
        callers file (``DATASERVICE_CALLERS_FILE``). Connects nothing until
        the first call."""
        super().__init__(caller, settings, config, key, AsyncTransport, AsyncHandle)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def results(
        self, handles: Sequence[AsyncHandle]
    ) -> builtins.list[Result | DataServiceError]:
        """Every handle's answer, or the error it raises, in their order."""
        return await gather_async(handles)

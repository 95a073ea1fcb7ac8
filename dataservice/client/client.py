"""The caller's API, synchronous: awaited calls on the interactive lane,
handles on the batch lane. Its threads share one reply channel (one reader
thread, one connection) and one broker connection, however many call at once.

Every request is signed with the caller's key (:mod:`dataservice.security.auth`);
the calls themselves, their retries included, are written once for both
clients (:mod:`.calls`): this one runs their steps by blocking.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from dataservice.client.calls import Blocking
from dataservice.client.handle import Handle, gather
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError
from dataservice.security.callers import CallerKey
from dataservice.types import Result


class Client(Blocking[Handle]):
    """A caller of the data service.

    ``read``, ``read_many``, ``write``, ``delete`` and ``list`` run on the
    interactive lane and wait for the answer; ``timeout`` (seconds) becomes
    the request's deadline, capped at the lane's maximum. ``submit`` and
    ``submit_many`` enqueue on the batch lane and return :class:`Handle`
    objects. Safe to share between threads.
    """

    _transport: Transport

    def __init__(
        self, caller: str, settings: Settings, config: Config, *, key: CallerKey | None = None
    ) -> None:
        """``key`` signs the requests; by default, the caller's first key in the
        callers file (``DATASERVICE_CALLERS_FILE``)."""
        super().__init__(caller, settings, config, key, Transport, Handle)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    def results(self, handles: Sequence[Handle]) -> builtins.list[Result | DataServiceError]:
        """Every handle's answer, or the error it raises, in their order, as
        :meth:`Handle.result` would give each."""
        return gather(handles)

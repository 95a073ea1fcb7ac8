"""How the harness calls the service: its public client, as a caller would."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.types import ReadOp, WriteOp, WriteResult

CALLER = "loadtest"
SCOPE = "load"
CALLERS_PER_CLIENT = 32


class ServiceAdapter:
    """Awaited calls on interactive, handles on batch, all in ``scope``;
    reads in ``read_mode``.

    A ``Client`` keeps a bounded pool of connections to wait on answers, so
    caller threads share one client per ``per_client`` threads instead of all
    waiting for one pool; ``more`` makes another client when the given ones
    are taken (without it, later threads share them round robin).
    """

    def __init__(
        self,
        clients: Sequence[Client],
        *,
        scope: str = SCOPE,
        per_client: int = CALLERS_PER_CLIENT,
        more: Callable[[], Client] | None = None,
        read_mode: ReadMode = ReadMode.PRIMARY,
    ) -> None:
        self._clients = list(clients)
        self._read_mode = read_mode
        self._scope = scope
        self._per_client = per_client
        self._more = more
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads = 0

    @classmethod
    def create(
        cls,
        settings: Settings,
        config: Config,
        callers: int = 0,
        read_mode: ReadMode = ReadMode.PRIMARY,
    ) -> ServiceAdapter:
        """Clients for the ``callers`` expected, made before the clock starts."""

        def more() -> Client:
            return Client(CALLER, settings, config)

        clients = [more() for _ in range(-(-callers // CALLERS_PER_CLIENT))]
        return cls(clients, more=more, read_mode=read_mode)

    @contextmanager
    def reading(self, mode: ReadMode) -> Iterator[None]:
        """Reads in ``mode`` for the block (the capacity probe of a cold-cache run)."""
        before, self._read_mode = self._read_mode, mode
        try:
            yield
        finally:
            self._read_mode = before

    def _client(self) -> Client:
        client: Client | None = getattr(self._local, "client", None)
        if client is not None:
            return client
        with self._lock:
            index = self._threads // self._per_client
            self._threads += 1
            if index >= len(self._clients) and self._more is not None:
                self._clients.append(self._more())
            client = self._clients[index % len(self._clients)]
        self._local.client = client
        return client

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> int | None:
        """The revision of an acknowledged write; None for a read."""
        client, scope = self._client(), self._scope
        if lane is LaneName.BATCH:
            operation: ReadOp | WriteOp = (
                ReadOp(scope, object_id, self._read_mode)
                if op == "read"
                else WriteOp(scope, object_id, payload)
            )
            result = client.submit(operation, timeout=timeout_s).result()
            return result.revision if isinstance(result, WriteResult) else None
        if op == "read":
            client.read(scope, object_id, mode=self._read_mode, timeout=timeout_s)
            return None
        return client.write(scope, object_id, payload, timeout=timeout_s).revision

    def close(self) -> None:
        """Close every client it holds, the ones it was given too."""
        for client in self._clients:
            client.close()

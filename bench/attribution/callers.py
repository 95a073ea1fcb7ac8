"""How the attribution bench's callers read through each system: one reader
per system, shared by the open loop's caller threads, and the adapter that
makes one (system, payload size, workload) cell out of it.

Every reader returns the record's payload, decoded from the system's own
answer, and the adapter checks its length, so a system that answered
something else fails the call instead of counting as done.
"""

from __future__ import annotations

import time
import uuid
from typing import Protocol

from bench.attribution.app import PLAIN_QUEUE, make_plain_app
from bench.attribution.wire import (
    PLAIN_TASK,
    json_message,
    json_request,
    json_response_payload,
    plain_payload,
)
from dataservice.broker.celery import celery_app
from dataservice.broker.results import ResultStore
from dataservice.client import Client
from dataservice.client.publisher import refusal_error
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import DeadlineExceeded
from dataservice.limits.admission import (
    CALLER_HEADER,
    DEADLINE_HEADER,
    OPERATION_HEADER,
    AdmissionRefused,
)
from dataservice.redis.bounded import SLACK_S, left, within

# The caller every system is asked as (the shipped queues.yml gives it generous limits).
CALLER = "loadtest"


class Reader(Protocol):
    def read(self, scope: str, object_id: str, cached: bool, timeout_s: float) -> bytes: ...

    def close(self) -> None: ...


class PlainReader:
    """(a): ``send_task(...).get()`` on a stock Celery app, as its users call it."""

    def __init__(self, url: str) -> None:
        self._app = make_plain_app(url)

    def read(self, scope: str, object_id: str, cached: bool, timeout_s: float) -> bytes:
        result = self._app.send_task(PLAIN_TASK, args=[scope, object_id, cached], queue=PLAIN_QUEUE)
        return plain_payload(result.get(timeout=timeout_s))

    def close(self) -> None:
        self._app.close()


class JsonReader:
    """(b): a JSON request pushed through the lane's admission on the service's
    broker channel, as the service client pushes its prepared message; the
    answer awaited on the caller's result list."""

    def __init__(self, settings: Settings, config: Config) -> None:
        self._app = celery_app("attribution-json-caller", settings, config, caller=True)
        self._results = ResultStore.from_url(settings.result_backend_url, bounded=True)
        self._queue = config.lanes[LaneName.INTERACTIVE].queue
        self._reply_to = self._app.thread_oid

    def read(self, scope: str, object_id: str, cached: bool, timeout_s: float) -> bytes:
        request_id = uuid.uuid4().hex
        deadline_ms = time.time_ns() // 1_000_000 + int(timeout_s * 1000)
        request = json_request(request_id, CALLER, scope, object_id, cached, deadline_ms)
        headers = {DEADLINE_HEADER: deadline_ms, CALLER_HEADER: CALLER, OPERATION_HEADER: "read"}
        message = json_message(request, self._queue, headers, self._reply_to)
        try:
            with (
                within(timeout_s + SLACK_S),
                self._app.pool.acquire(block=True, timeout=left()) as connection,
            ):
                connection.default_channel.admit(self._queue, message)
        except AdmissionRefused as refusal:
            raise refusal_error(refusal) from None
        body = self._results.wait(CALLER, request_id, deadline_ms / 1000 - time.time())
        if body is None:
            raise DeadlineExceeded(f"no answer to {request_id} within {timeout_s} s")
        return json_response_payload(body)

    def close(self) -> None:
        self._results.close()
        self._app.close()


class ServiceReader:
    """(c): the service's own client."""

    def __init__(self, settings: Settings, config: Config) -> None:
        self._client = Client(CALLER, settings, config)

    def read(self, scope: str, object_id: str, cached: bool, timeout_s: float) -> bytes:
        mode = ReadMode.ALLOW_CACHED if cached else ReadMode.PRIMARY
        return self._client.read(scope, object_id, mode=mode, timeout=timeout_s).payload

    def close(self) -> None:
        self._client.close()


class CellAdapter:
    """One cell's reads for :class:`~dataservice_tools.loadtest.openloop.OpenLoop`:
    ``scope`` holds records of ``size`` bytes."""

    def __init__(self, reader: Reader, scope: str, size: int, cached: bool) -> None:
        self._reader = reader
        self._scope = scope
        self._size = size
        self._cached = cached

    def read(self, object_id: str, timeout_s: float) -> None:
        payload = self._reader.read(self._scope, object_id, self._cached, timeout_s)
        if len(payload) != self._size:
            raise AssertionError(f"{object_id}: {len(payload)} bytes, expected {self._size}")

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> int | None:
        self.read(object_id, timeout_s)
        return None

    def close(self) -> None:
        """The reader outlives its cells."""

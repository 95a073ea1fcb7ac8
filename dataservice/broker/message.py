"""A request as the message Celery would publish, built directly: what the
RabbitMQ broker publishes, and what ``publish.lua`` builds on Redis (a test
keeps the two equal).

``Celery.send_task`` builds a protocol 2 task message through several layers
(the app's task sender, kombu's producer, entity declaration, the channel),
which costs more CPU than everything else a caller does per request. The
client builds the same message itself: Celery's headers here, the rest as
kombu's Redis transport stores it (:func:`dataservice.compat.kombu.stored_message`),
and hands it to the broker's admission (:mod:`dataservice.broker`). A
test keeps it equal, field for field, to what ``send_task`` produces.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from dataservice.broker.base import Request
from dataservice.compat import kombu as kombu_compat
from dataservice.limits.admission import (
    CALLER_HEADER,
    DEADLINE_HEADER,
    OPERATION_HEADER,
    OPS_HEADER,
)

# The task every request is (its body the SignedRequest), and its content type.
TASK_NAME = "dataservice.handle"
CONTENT_TYPE = "application/x-protobuf"
# Celery's anonymous node name for a process that is not a worker.
ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"


def task_message(
    body: bytes, request_id: str, queue: str, headers: dict[str, Any], reply_to: str
) -> dict[str, Any]:
    """The kombu message for one request to ``queue`` (``headers``: the service's own)."""
    argsrepr = f"<RequestEnvelope {len(body)} bytes>"
    return kombu_compat.stored_message(
        body,
        queue=queue,
        content_type=CONTENT_TYPE,
        content_encoding="binary",
        # Celery's task protocol 2.
        headers={
            "lang": "py",
            "task": TASK_NAME,
            "id": request_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": request_id,
            "parent_id": None,
            # Celery would put repr(args) (the payload) here, where monitoring
            # tools display it.
            "argsrepr": argsrepr,
            "kwargsrepr": "{}",
            "origin": ORIGIN,
            "ignore_result": True,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
            **headers,
        },
        properties={
            "correlation_id": request_id,
            "reply_to": reply_to,
            "argsrepr": argsrepr,
            "kwargsrepr": "{}",
        },
    )


def request_headers(caller: str, deadline_ms: int, operation: str, ops: int) -> dict[str, Any]:
    """The service's own headers of one message (admission reads them)."""
    headers: dict[str, Any] = {DEADLINE_HEADER: deadline_ms}
    if caller:
        headers[CALLER_HEADER] = caller
    if operation:
        headers[OPERATION_HEADER] = operation
    if ops > 1:
        headers[OPS_HEADER] = ops
    return headers


def request_message(request: Request) -> dict[str, Any]:
    """The kombu message of ``request``."""
    headers = request_headers(request.caller, request.deadline_ms, request.operation, request.ops)
    return task_message(request.body, request.request_id, request.queue, headers, request.reply_to)

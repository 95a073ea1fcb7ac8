"""A request as the message Celery would publish, built directly.

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

from dataservice.broker.celery import CONTENT_TYPE, TASK_NAME
from dataservice.compat import kombu as kombu_compat

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

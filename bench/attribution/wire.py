"""The JSON wire of the attribution bench's two JSON systems, shared by their
callers, their workers and the in-process fixtures (so the fixtures time the
very functions the integrated runs call).

- **(a) plain**: stock Celery. The task's arguments are ``[scope, object_id,
  cached]`` in Celery's JSON; it returns the record as a JSON object with the
  payload in base64 (:func:`plain_value`), which Celery's Redis result
  backend stores inside its own JSON meta. Its cache holds the same object.
- **(b) admitted JSON**: the request is one JSON object (:func:`json_request`)
  in a Celery task message built like the service client's prepared message
  (:func:`json_message`), and the answer a JSON object (:func:`json_response`)
  left in the service's result list for the caller.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from kombu import serialization

from dataservice.broker.message import task_message
from dataservice.codec import record_to_pb
from dataservice.proto import pb
from dataservice.types import Record

PLAIN_TASK = "attribution.plain_read"
JSON_TASK = "attribution.json_read"
# Celery's embedded signatures, all empty: what ``send_task`` puts in a body.
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
OK = "ok"
_COMPACT = (",", ":")
# kombu's serializer registry, as Celery calls it (kombu is untyped).
kombu_dumps: Callable[..., tuple[str, str, str | bytes]] = serialization.dumps
kombu_loads: Callable[..., Any] = serialization.loads


class AnswerError(Exception):
    """A JSON system answered with a status other than ``ok``."""


# (a) ------------------------------------------------------------------------------


def plain_value(record: Record) -> dict[str, Any]:
    """The record as the plain task returns it and its cache keeps it."""
    return {
        "object_id": record.object_id,
        "revision": record.revision,
        "payload": base64.b64encode(record.payload).decode("ascii"),
        "updated_at_unix_ms": record_to_pb(record).updated_at_unix_ms,
    }


def plain_payload(value: Any) -> bytes:
    """The payload out of what the plain task returned."""
    if not isinstance(value, dict):
        raise AnswerError(f"the plain task answered {value!r:.80}")
    return base64.b64decode(value["payload"])


# (b) ------------------------------------------------------------------------------


def json_request(
    request_id: str, caller: str, scope: str, object_id: str, cached: bool, deadline_ms: int
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "caller": caller,
        "deadline_ms": deadline_ms,
        "op": "read",
        "scope": scope,
        "object_id": object_id,
        "mode": "allow_cached" if cached else "primary",
    }


def encode_task_body(args: list[Any]) -> tuple[str, str, bytes]:
    """Content type, encoding and body of a task with ``args``, by Celery's JSON serializer."""
    content_type, encoding, body = kombu_dumps((args, {}, EMBED), serializer="json")
    return content_type, encoding, body.encode() if isinstance(body, str) else body


def decode_task_body(body: bytes, content_type: str, encoding: str) -> Any:
    return kombu_loads(body, content_type, encoding)


def json_message(
    request: dict[str, Any], queue: str, headers: dict[str, Any], reply_to: str
) -> dict[str, Any]:
    """The kombu message for ``request``: the service client's prepared message
    (:func:`~dataservice.broker.message.task_message`), carrying JSON."""
    content_type, encoding, body = encode_task_body([request])
    message = task_message(body, request["request_id"], queue, headers, reply_to)
    message["content-type"] = content_type
    message["content-encoding"] = encoding
    message["headers"]["task"] = JSON_TASK
    argsrepr = f"<read {request['scope']}/{request['object_id']}>"
    message["headers"]["argsrepr"] = message["properties"]["argsrepr"] = argsrepr
    return message


def json_response(request_id: str, record: pb.Record | None, status: str = OK) -> bytes:
    """The answer to a (b) read: the record's four fields, the payload in base64."""
    document: dict[str, Any] = {"request_id": request_id, "status": status, "record": None}
    if record is not None:
        document["record"] = {
            "object_id": record.object_id,
            "revision": record.revision,
            "payload": binascii.b2a_base64(record.payload, newline=False).decode("ascii"),
            "updated_at_unix_ms": record.updated_at_unix_ms,
        }
    return json.dumps(document, separators=_COMPACT).encode()


def json_response_payload(body: bytes) -> bytes:
    """The payload out of a (b) answer; :class:`AnswerError` unless it is ``ok``."""
    document = json.loads(body)
    if document.get("status") != OK or document.get("record") is None:
        raise AnswerError(f"answered {document.get('status')!r}")
    return binascii.a2b_base64(document["record"]["payload"])

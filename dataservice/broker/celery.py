"""Celery's part: the task, its serializer, and the Celery settings shared by
the clients' publishers and the worker pools, whichever the broker. The wire
format itself is :mod:`dataservice.codec`; the broker's own settings come
from its module (:mod:`.redis`, :mod:`.rabbitmq`).

The task body *is* the ``SignedRequest`` bytes: the serializer carries exactly
one ``bytes`` argument and nothing else (no kwargs, no callbacks), with
content type ``application/x-protobuf``. Decoding never fails in the
serializer, so a malformed body reaches the request handler, which counts it
(reason ``malformed``) and answers the caller it names, if it names one,
instead of Celery dropping it unseen.

Pickle is never accepted. JSON is accepted only because Celery's control plane
(``inspect``, ``ping``, used by Flower and ``make run``'s summary) speaks it; a
task message in JSON cannot carry the envelope's bytes and is refused as
malformed.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.entity import Exchange, Queue
from kombu.serialization import register

from dataservice.broker import broker_for
from dataservice.broker.message import CONTENT_TYPE, TASK_NAME
from dataservice.config.model import Config
from dataservice.config.settings import Settings

__all__ = ["CONTENT_TYPE", "TASK_NAME", "celery_app", "celery_settings"]

SERIALIZER = "protobuf"
_NO_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def _encode(body: Any) -> bytes:
    try:
        args, kwargs, embed = body
    except (TypeError, ValueError):
        raise TypeError("the protobuf serializer carries only task messages") from None
    if kwargs or len(args) != 1 or not isinstance(args[0], bytes) or any(embed.values()):
        raise TypeError("a protobuf task message carries exactly one SignedRequest")
    return bytes(args[0])


def _decode(data: bytes | str) -> tuple[tuple[bytes], dict[str, Any], dict[str, Any]]:
    raw = data.encode("latin-1") if isinstance(data, str) else bytes(data)
    return (raw,), {}, dict(_NO_EMBED)


register(SERIALIZER, _encode, _decode, content_type=CONTENT_TYPE, content_encoding="binary")


def direct_queue(name: str) -> Queue:
    """A queue bound to a direct exchange of its own name (the lanes', the consumers')."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def celery_settings(settings: Settings, config: Config) -> dict[str, Any]:
    """Celery configuration shared by publishers and workers."""
    queues = [direct_queue(lane.queue) for lane in (config.lanes.interactive, config.lanes.batch)]
    common = {
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": [CONTENT_TYPE, "application/json"],
        "task_queues": queues,
        "task_create_missing_queues": False,
        "task_default_queue": config.lanes.batch.queue,
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        # A request running when the broker connection drops runs to its end
        # and answers; its message, never acknowledged, comes again, as after
        # a worker's death. (Celery warns until this is set; a thread cannot
        # be cancelled anyway.)
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "enable_utc": True,
    }
    return {**common, **broker_for(settings).celery_settings(config)}


def celery_app(name: str, settings: Settings, config: Config, *, caller: bool = False) -> Celery:
    """A Celery app on the service's broker, with the shared settings (not the
    process's current app: several may live in one process); a ``caller``'s
    publishes keep to their deadlines."""
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_settings(settings, config))
    if caller:
        # Publishing must never hang a caller past its deadline on a dead broker.
        app.conf.broker_connection_timeout = 2
        app.conf.broker_connection_max_retries = 0
        broker_for(settings).caller_settings(app.conf)
    return app

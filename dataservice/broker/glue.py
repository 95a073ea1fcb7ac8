"""The Celery and kombu glue: how requests travel through the broker.

The protobuf serializer, the broker channel that runs admission, and the
Celery settings shared by the client's publisher and the worker pools. The
wire format itself is :mod:`dataservice.codec`.

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

The broker is always reached through :class:`RedisTransport`, over
``redis://`` and ``rediss://`` alike, so admission and caller pacing hold
whichever is used. With ``rediss://`` the connection is TLS with the
certificate options of the URL's query (:mod:`dataservice.redis.tls`); given none,
the server's certificate must verify against the system CAs and match its
host name (``ssl_cert_reqs=required``), where kombu on its own would accept
any certificate. The options reach kombu as ``broker_use_ssl`` and are
removed from the URL it sees, so they are read one way only.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Protocol

import redis
from celery import Celery
from kombu.entity import Exchange, Queue
from kombu.serialization import register
from redis.backoff import NoBackoff
from redis.retry import Retry

from dataservice.broker import rabbitmq
from dataservice.compat import kombu as kombu_compat
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.limits.admission import (
    OPS_HEADER,
    SIZE_HEADER,
    AdmissionRefused,
    LaneAdmission,
    admit,
    caller_pacing,
    envelope_size,
    lane_admissions,
)
from dataservice.redis.bounded import QUIET, BoundedConnection, BoundedSSLConnection
from dataservice.redis.keys import EPOCH_KEY
from dataservice.redis.packing import PackedConnection, PackedSSLConnection
from dataservice.redis.tls import redis_tls, without_tls_options
from dataservice.tcp import KEEPALIVE

CONNECT_TIMEOUT_S = 2.0
TASK_NAME = "dataservice.handle"
SERIALIZER = "protobuf"
CONTENT_TYPE = "application/x-protobuf"
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


class _Channel(kombu_compat.RedisChannel):
    """kombu's Redis channel, with admission.

    - A message for a lane queue is pushed by the admission script, which
      refuses it when the queue is full or too long for its deadline (see
      :mod:`dataservice.limits.admission`): the publish raises
      :class:`~dataservice.limits.admission.AdmissionRefused`, whoever
      publishes; other messages (control replies) go as usual.
    - The record of a lane message's delivery waits for the task's strategy
      (``dataservice/pools/fastpath.py``): a message the worker answers and acknowledges
      at once needs none (its answer and its acknowledgement are one step).
    """

    # Commands packed by hiredis in one call (dataservice.redis.packing).
    redis_connection_class: ClassVar[type[redis.Connection]] = PackedConnection
    redis_ssl_connection_class: ClassVar[type[redis.SSLConnection] | None] = PackedSSLConnection
    redis_options = QUIET

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.connection.client.transport_options
        lanes = options.get("dataservice_admission") or {}
        self._admission = {queue: LaneAdmission(**lane) for queue, lane in lanes.items()}
        self.lane_queues = frozenset(self._admission)
        self._pacing = options.get("dataservice_pacing") or {}

    def push(self, queue: str, message: dict[str, Any]) -> bool:
        if queue not in self._admission:
            return False
        try:
            self.admit(queue, message)
        except AdmissionRefused as refusal:
            # Whoever published hears it, stock Celery's send_task and kombu's
            # Producer.publish included (neither retries on it), as the
            # clients' own error.
            raise refusal.error() from None
        return True

    def defers_record(self, message: Any) -> bool:
        # A batch message (``ds_ops``: never answered on the consumer thread)
        # is recorded at once: a worker killed before its strategy ran would
        # lose every operation it carries.
        batch = OPS_HEADER in (message.headers or {})
        return message.delivery_info.get("routing_key") in self.lane_queues and not batch

    def admit(self, queue: str, message: dict[str, Any]) -> str:
        """Push a request message onto a lane's queue through admission and
        return the broker's epoch, or raise :class:`AdmissionRefused` (or
        ``redis.RedisError``)."""
        key = self.queue_key(queue, message)
        message.setdefault("headers", {})[SIZE_HEADER] = envelope_size(message)
        entry = kombu_compat.queue_entry(message)
        return admit(self.redis_client(), key, self._admission[queue], entry, message, self._pacing)

    def epoch(self) -> str:
        """The broker's epoch now ('' when it has none: no request admitted
        since it started); raises ``redis.RedisError``."""
        value = self.redis_client().get(EPOCH_KEY)
        return value.decode() if isinstance(value, bytes) else ""


class RedisTransport(kombu_compat.RedisTransport):
    Channel = _Channel


class _CallerChannel(_Channel):
    """A caller's channel: its Redis calls keep to the bound of the publish they
    serve (:mod:`dataservice.redis.bounded`), and redis-py retries none of them (its
    back-off would sleep past any deadline; the client retries within it)."""

    redis_connection_class = BoundedConnection
    redis_ssl_connection_class = BoundedSSLConnection

    def client_factory(self) -> Any:
        return functools.partial(redis.Redis, retry=Retry(NoBackoff(), 0))


class CallerRedisTransport(RedisTransport):
    """The transport of clients (publishers that hold deadlines), not of workers."""

    Channel = _CallerChannel


class QueueDepths(Protocol):
    """How many messages wait in a lane's queue, on the broker in use."""

    def depth(self, queue: str) -> int: ...

    def close(self) -> None: ...


class _RedisDepths:
    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=2, **QUIET)

    def depth(self, queue: str) -> int:
        return int(self._redis.llen(queue))

    def close(self) -> None:
        self._redis.close()


def queue_depths(settings: Settings) -> QueueDepths:
    """A :class:`QueueDepths` on the service's broker (connects on first use)."""
    if settings.broker_is_amqp:
        return rabbitmq.AmqpDepths(settings.broker_url)
    return _RedisDepths(settings.broker_url)


def direct_queue(name: str) -> Queue:
    """A queue bound to a direct exchange of its own name (the lanes', the consumers')."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def celery_settings(settings: Settings, config: Config) -> dict[str, Any]:
    """Celery configuration shared by publishers and workers."""
    queues = [direct_queue(lane.queue) for lane in (config.lanes.interactive, config.lanes.batch)]
    # A message not acknowledged within the visibility timeout is delivered
    # again; past the longest deadline a redelivery could only be dropped as
    # late, so by default the timeout sits just beyond it.
    visibility_s = config.broker.visibility_timeout_s or config.longest_deadline_ms // 1000 + 60
    # Naming the transport hides the scheme from kombu, and with it kombu's own
    # rediss:// handling; TLS comes from the URL's options, passed explicitly.
    tls = redis_tls(settings.broker_url, "the broker URL")
    tls_options = tls.kombu_options() if tls else None
    over_tcp = settings.broker_url.startswith(("redis://", "rediss://"))
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
    if settings.broker_is_amqp:
        return {**common, **rabbitmq.broker_settings(settings, config)}
    return {
        **common,
        "broker_url": without_tls_options(settings.broker_url),
        "broker_transport": f"{__name__}:RedisTransport" if over_tcp else None,
        "broker_use_ssl": tls_options or False,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": visibility_s,
            # kombu sweeps every interval x throttle seconds; one knob is enough.
            "unacked_restore_interval": config.broker.restore_every_s,
            "unacked_restore_throttle": 1,
            # A worker waits for messages with no timeout of its own: a half-open
            # connection (a network cut) must end, and the worker reconnect, not
            # wait for TCP's retransmissions to reach a healed path.
            "socket_keepalive": True,
            "socket_keepalive_options": KEEPALIVE,
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "dataservice_admission": lane_admissions(config),
            "dataservice_pacing": caller_pacing(config),
            # Unused by the channel: kombu's process-wide producer pools are
            # keyed by host, credentials and transport options, not TLS options,
            # so without this a client could publish on another's connection
            # made with weaker certificate checks.
            "dataservice_tls": tls_options,
        },
    }


def celery_app(name: str, settings: Settings, config: Config, *, caller: bool = False) -> Celery:
    """A Celery app on the service's broker, with the shared settings (not the
    process's current app: several may live in one process); a ``caller``'s
    publishes keep to their deadlines (:class:`CallerRedisTransport`)."""
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_settings(settings, config))
    if not caller:
        return app
    # Publishing must never hang a caller past its deadline on a dead broker.
    app.conf.broker_connection_timeout = 2
    app.conf.broker_connection_max_retries = 0
    if app.conf.broker_transport:
        app.conf.broker_transport = f"{__name__}:CallerRedisTransport"
        # A lost connection is made again on the next publish, once: kombu's
        # default would sleep between attempts, past any deadline.
        app.conf.broker_transport_options = {
            **app.conf.broker_transport_options,
            "max_retries": 0,
        }
    return app

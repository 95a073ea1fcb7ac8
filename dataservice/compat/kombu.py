r"""kombu's internals the service relies on: its Redis transport's hooks and
key layout.

Tested with kombu 5.7.0 (``pyproject.toml`` pins ``kombu~=5.7.0`` for this
module's sake); ``tests/compat/test_compat.py`` pins each name below, by signature
and, where cheap, by its behaviour on a real Redis.

The service's channels (:mod:`dataservice.broker.redis`) subclass
:class:`RedisChannel` and use only its public hooks: :meth:`~RedisChannel.push`,
:meth:`~RedisChannel.defers_record`, :meth:`~RedisChannel.client_factory`,
:attr:`~RedisChannel.redis_options` and the connection classes.

Internal names, and why:

- ``kombu.transport.redis.Channel._put``: overridden, so that a channel may
  push a message its own way (:meth:`RedisChannel.push`: admission's script)
  instead of kombu's plain LPUSH.
- ``_publish_batch``: the keyword with which kombu hands ``_put`` a batch;
  a batch is left to kombu.
- ``kombu.transport.redis.Channel.supports_batch_publish``: turned off, as a
  batch would go out with kombu's LPUSH, past :meth:`RedisChannel.push`.
- ``kombu.transport.redis.Channel._connparams``: extended with
  :attr:`RedisChannel.redis_options`; on a Unix socket
  (:class:`RedisUnixChannel`), with redis-py's reading of the ``unix://``
  URL (the socket's path, the database, the credentials), in place of the
  host and port kombu puts there and of the TCP options a Unix socket's
  connection refuses (``socket_keepalive``, ``socket_keepalive_options``).
- ``kombu.transport.base.Transport.can_parse_url``: set on
  :class:`RedisUnixTransport`, so that kombu's ``Connection`` keeps a
  ``unix://`` URL whole, as its hostname, instead of reading a host (none)
  and a database (the socket's path) out of it. kombu's own forms will not
  do: ``redis+socket://`` names kombu's stock transport, whatever transport
  is asked for, and with ``socket://`` its ``_connparams`` makes the pools'
  connections redis-py's plain ``UnixDomainSocketConnection``, whatever the
  channel's class, and drops their connect timeout.
- ``kombu.transport.redis.Channel._get_client``: what kombu builds its clients
  with, replaced by :meth:`RedisChannel.client_factory`.
- ``kombu.transport.redis.Channel.connection_class``, ``connection_class_ssl``:
  the redis-py connection classes of kombu's pools, set from
  :attr:`RedisChannel.redis_connection_class` and ``redis_ssl_connection_class``.
- ``kombu.transport.redis.Channel.conn_or_acquire``: overridden to hand out one
  client for the channel's lifetime (:meth:`RedisChannel.redis_client`).
- ``kombu.transport.redis.Channel._create_client``, ``_pool``: how that
  client is made, and whether the channel still has a pool to make it on.
- ``kombu.transport.redis.Channel._q_for_pri``, ``_get_message_priority``:
  the list a message is pushed onto (:meth:`RedisChannel.queue_key`).
- ``kombu.transport.redis.SentinelChannel``: kombu's channel on a
  Sentinel-managed primary (its ``_get_pool`` formats the fanout prefix and
  asks ``_sentinel_managed_pool`` for the pool, on the primary named by the
  transport option ``master_name``). :class:`RedisSentinelChannel` puts it
  beneath :class:`RedisChannel`'s hooks; its pools' connection classes must be
  redis-py's ``SentinelManagedConnection`` or a subclass.
- ``kombu.transport.redis.SentinelChannel._sentinel_managed_pool``: replaced,
  to take the Sentinels from the transport option ``dataservice_sentinels``
  rather than from the connection's ``;``-joined fallback URLs (a fallback
  would switch the connection to kombu's stock transport, without the
  service's hooks or credentials); it keeps the Sentinel client where kombu's
  disconnect closes it (``_sentinel_manager``, ``_async_sentinel_manager``).
  The primary's pool takes ``_connparams`` whole (with TLS, the ``ssl``
  options and ``connection_class_ssl``); the Sentinels are asked with the
  transport option ``sentinel_kwargs`` alone, so TLS to them goes there.
- ``kombu.transport.redis.QoS.append``: overridden, so that the record of a
  delivery may wait for the consumer's decision (:class:`RedisQoS`).
- ``kombu.transport.redis.QoS.unacked_key``, ``unacked_index_key``: the names of
  the unacknowledged messages' hash and index (:func:`unacked_keys`).
- ``kombu.transport.virtual.QoS.append``, ``kombu.transport.virtual.QoS.ack``:
  the channel's in-memory books of a delivered message (its prefetch count),
  kept without the Redis writes of kombu's Redis ``QoS``, which this module
  or the service's scripts make instead.
- ``kombu.transport.virtual.Message._raw``: the message as delivered (the
  payload a virtual transport builds its message from), which kombu's record
  of it holds (:func:`unacked_record`).
- ``kombu.message.Message._state``: ``'ACK'`` once acknowledged, as
  ``Message.ack`` would set it (:func:`settle_acknowledged`).
- ``kombu.transport.redis.Channel.sep``, ``keyprefix_queue``,
  ``keyprefix_binding_permanent``: :data:`PRIORITY_SEP`, :data:`BINDING_PREFIX`,
  :data:`PERMANENT_BINDING_PREFIX` (:mod:`dataservice.redis.keys` builds the keys
  from them, :mod:`dataservice.security.acl` grants them).

And one of the standard library's: ``json.encoder.c_make_encoder``, the C
encoder ``json.dumps`` uses, made once for :func:`queue_entry` (kombu's
``dumps`` where it is missing).

The layout of kombu's Redis keys, which is kombu's, owned here and written
also by the service's Lua scripts (``limits/admit.lua`` pushes onto a queue's
list; ``limits/delivered.lua``, through ``gate.lua`` and ``hit.lua``, records
a delivery; ``answer.lua`` and ``hit.lua`` acknowledge one):

- A waiting message is an entry of its queue's list (:meth:`RedisChannel.queue_key`:
  the queue's name, or ``<queue>\x06\x16<step>`` for a priority above 0),
  ``dumps(message)`` (:func:`queue_entry`), pushed on the left; kombu takes
  from the right.
- A delivered, unacknowledged message is its delivery tag in a sorted set
  (``unacked_index``), scored with when it was delivered (Unix s), and in a
  hash (``unacked``), tag -> ``dumps([message, exchange, routing_key])``
  (:func:`unacked_record`). kombu's restore sweep pushes back every message
  indexed for longer than the visibility timeout; acknowledging removes both
  entries. The two names are transport options: :func:`unacked_keys` reads
  them off the message's channel.
"""

from __future__ import annotations

import base64
import functools
import json.encoder
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Final

import redis
import redis.sentinel
from kombu.common import oid_from
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.utils.json import JSONEncoder, dumps

from dataservice.compat.redis import url_options

__all__ = [
    "BINDING_PREFIX",
    "PERMANENT_BINDING_PREFIX",
    "PRIORITY_SEP",
    "RedisChannel",
    "RedisQoS",
    "RedisTransport",
    "RedisUnixChannel",
    "RedisUnixTransport",
    "delivery_record",
    "queue_entry",
    "recorded_elsewhere",
    "reply_address",
    "settle_acknowledged",
    "stored_message",
    "unacked_keys",
    "unacked_record",
    "write_deferred",
]

#: Between a queue's name and its priority step, in the names of its lists.
PRIORITY_SEP: Final = "\x06\x16"
#: An exchange's routing table: a set of ``<routing key>\x06\x16<pattern>\x06\x16<queue>``.
BINDING_PREFIX: Final = "_kombu.binding."
#: Its twin, which keeps the table from kombu's sweep of expired bindings.
PERMANENT_BINDING_PREFIX: Final = "_kombu.binding_permanent."


def stored_message(
    body: bytes,
    *,
    queue: str,
    content_type: str,
    content_encoding: str,
    headers: dict[str, Any],
    properties: dict[str, Any],
) -> dict[str, Any]:
    """A message for ``queue`` as kombu's Redis transport stores it (what a
    producer's publish makes of it): the body in base64, and kombu's own
    properties after the publisher's (persistent, the default exchange and
    priority, a fresh delivery tag)."""
    return {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": headers,
        "properties": {
            **properties,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": _uuid4(),
        },
    }


def _uuid4() -> str:
    """``str(uuid.uuid4())``, as kombu tags a delivery, at half its CPU
    (no ``UUID`` object made on the way)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # the version: 4
    raw[8] = raw[8] & 0x3F | 0x80  # the variant: RFC 4122
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _entry_encoder() -> Callable[[Any], str]:
    """kombu's ``dumps``, made once: kombu builds a ``JSONEncoder`` per call,
    whose ``encode`` also keeps a set of every container it enters, against
    cycles, which a message built here never has. The same C encoder with
    the same options (and kombu's ``default`` for other types) writes the
    same text in about 0.8x the CPU."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return lambda message: str(dumps(message))
    encode = make(
        None,  # no cycle check
        JSONEncoder().default,
        json.encoder.encode_basestring_ascii,
        None,  # indent
        ": ",
        ", ",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    return lambda message: "".join(encode(message, 0))


_encode_entry = _entry_encoder()


def queue_entry(message: dict[str, Any]) -> str:
    """``message`` as kombu keeps it in a queue's list."""
    return _encode_entry(message)


def reply_address(owner: object) -> str:
    """The reply address (``reply_to``) a publisher that is not a Celery app
    puts on its messages: kombu's object id, as an app's ``thread_oid`` is
    made (Celery's control plane would reply there; the service never does)."""
    return str(oid_from(owner, threads=False))


def unacked_record(message: Any) -> str:
    """A delivered ``message`` (a ``kombu.Message``) as kombu records it among
    the unacknowledged."""
    delivery = message.delivery_info
    return str(dumps([message._raw, delivery["exchange"], delivery["routing_key"]]))


def _qos(message: Any) -> Any:
    # A RabbitMQ channel keeps no books of its own: the broker does.
    return getattr(message.channel, "qos", None)


def unacked_keys(message: Any) -> tuple[str, str] | None:
    """The index and the hash of unacknowledged messages on ``message``'s
    broker, or None when its channel is not kombu's Redis channel."""
    qos = _qos(message)
    if not isinstance(qos, kombu_redis.QoS):
        return None
    return str(qos.unacked_index_key), str(qos.unacked_key)


def delivery_record(message: Any) -> Callable[[], str] | None:
    """What builds ``message``'s record among the unacknowledged, for a
    handler that records its delivery itself (then :func:`recorded_elsewhere`);
    None unless its channel is a :class:`RedisChannel`, whose record may wait."""
    if not isinstance(_qos(message), RedisQoS):
        return None
    return functools.partial(unacked_record, message)


def record_pending(message: Any) -> bool:
    """Whether the record of ``message``'s delivery waits for the consumer's
    decision (nothing in Redis says it was delivered yet)."""
    qos = _qos(message)
    return isinstance(qos, RedisQoS) and qos.pending(message)


def write_deferred(message: Any) -> None:
    """Write the record of a delivery that ``message``'s channel deferred
    (:meth:`RedisChannel.defers_record`), unless it was acknowledged since."""
    qos = _qos(message)
    if isinstance(qos, RedisQoS):
        qos.flush()


def recorded_elsewhere(message: Any) -> None:
    """``message``'s delivery was recorded by a script of the service
    (``limits/delivered.lua``): its deferred record is not to be written."""
    qos = _qos(message)
    if isinstance(qos, RedisQoS):
        qos.recorded(message)


def settle_acknowledged(message: Any) -> None:
    """kombu's books of a message whose acknowledgement a script of the
    service made in Redis (``answer.lua``, ``hit.lua``): the channel's count
    of unacknowledged messages, so the prefetch window moves on, and the
    message's state, without kombu's own ZREM and HDEL."""
    kombu_virtual.QoS.ack(message.channel.qos, message.delivery_tag)
    message._state = "ACK"


class RedisQoS(kombu_redis.QoS):
    """kombu's record of delivered messages (what a restart restores), in
    kombu's layout, written here.

    - Its two commands go without MULTI/EXEC: they travel in one write either
      way, and the sweep that reads them back only looks at entries older
      than the visibility timeout, so no reader sees one without the other.
    - A delivery the channel defers (:meth:`RedisChannel.defers_record`) is
      recorded when the consumer has decided (:func:`write_deferred`), on
      the same thread, unless acknowledged by then; until then the message
      exists only in this worker, as between kombu's ``BRPOP`` and its own
      record. The next delivery writes it too, so at most one waits.
    """

    _pending: tuple[Any, str] | None = None

    def append(self, message: Any, delivery_tag: str) -> None:
        self.flush()
        if self.channel.defers_record(message):
            self._pending = (message, delivery_tag)
        else:
            self._write(message, delivery_tag)
        kombu_virtual.QoS.append(self, message, delivery_tag)

    def flush(self) -> None:
        """Write the pending delivery's record, unless it was acknowledged."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending[0].acknowledged:
            self._write(*pending)

    def pending(self, message: Any) -> bool:
        """Whether ``message``'s record is the one waiting to be written."""
        return self._pending is not None and self._pending[0] is message

    def recorded(self, message: Any) -> None:
        """``message``'s record was written elsewhere: it is not pending any more."""
        if self._pending is not None and self._pending[0] is message:
            self._pending = None

    def _write(self, message: Any, delivery_tag: str) -> None:
        with self.channel.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
            pipe.hset(self.unacked_key, delivery_tag, unacked_record(message))
            pipe.execute()


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, with public hooks for what the service changes,
    and one client for its lifetime.

    The stock channel builds a new client object on every publish and twice
    per delivered message (the record and the ack): about a quarter of a
    publish's CPU. The client sits on the channel's own thread-safe
    connection pool, so sharing it changes nothing else.
    """

    QoS = RedisQoS
    #: Options added to every connection the channel's pools make.
    redis_options: ClassVar[Mapping[str, Any]] = {}
    #: The redis-py connection classes of its pools: plain (or, on a Unix
    #: socket, its kind), and TLS.
    redis_connection_class: ClassVar[
        type[redis.Connection] | type[redis.UnixDomainSocketConnection]
    ] = redis.Connection
    redis_ssl_connection_class: ClassVar[type[redis.SSLConnection] | None] = redis.SSLConnection
    supports_batch_publish = False
    _shared_client: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # kombu's own annotation knows only TCP classes; its pools take any.
        cls.connection_class = cls.redis_connection_class  # type: ignore[assignment]
        cls.connection_class_ssl = cls.redis_ssl_connection_class

    def push(self, queue: str, message: dict[str, Any]) -> bool:
        """Push ``message`` onto ``queue`` (a list of :meth:`queue_key`, in
        kombu's form, :func:`queue_entry`) and return True; False leaves
        the push to kombu."""
        return False

    def defers_record(self, message: Any) -> bool:
        """Whether the record of ``message``'s delivery waits for the
        consumer's decision (:func:`write_deferred`)."""
        return False

    def client_factory(self) -> Callable[..., Any]:
        """What the channel builds its Redis clients with."""
        factory: Callable[..., Any] = super()._get_client()
        return factory

    def queue_key(self, queue: str, message: dict[str, Any]) -> str:
        """The list kombu would push ``message`` onto for ``queue``."""
        return str(self._q_for_pri(queue, self._get_message_priority(message, reverse=False)))

    def redis_client(self) -> Any:
        """The channel's client, on its current pool."""
        if self._pool is None and self.connection.client is None:
            # Closing after the broker went away (kombu restores what was
            # delivered): there is nothing left to build a client from. As a
            # connection error, the worker's consumer reconnects; anything
            # else would end the worker.
            raise redis.ConnectionError("the broker connection is closed")
        # kombu replaces its pool on disconnect; a client on the old one is stale.
        if self._shared_client is None or self._shared_client.connection_pool is not self.pool:
            self._shared_client = self._create_client()
        return self._shared_client

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self.redis_client()

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        if kwargs.get("_publish_batch") is None and self.push(queue, message):
            return
        super()._put(queue, message, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)
        return {**params, **self.redis_options}

    def _get_client(self) -> Any:
        return self.client_factory()


class RedisSentinelChannel(RedisChannel, kombu_redis.SentinelChannel):
    """:class:`RedisChannel` on a Sentinel-managed primary."""

    from_transport_options = (  # type: ignore[assignment]  # kombu's stubs fix its length
        *kombu_redis.SentinelChannel.from_transport_options,
        "dataservice_sentinels",
    )
    #: Every Sentinel, ``(host, port)``; none: the connection's host and port.
    dataservice_sentinels: Sequence[Sequence[Any]] = ()

    redis_connection_class: ClassVar[type[redis.Connection]] = (
        redis.sentinel.SentinelManagedConnection
    )
    redis_ssl_connection_class: ClassVar[type[redis.SSLConnection] | None] = (
        redis.sentinel.SentinelManagedSSLConnection
    )

    def sentinels_made(self, manager: redis.sentinel.Sentinel) -> None:
        """Called with the channel's Sentinel manager before it asks anything."""

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        params = self._connparams(asynchronous)
        options = {k: v for k, v in params.items() if k not in ("host", "port")}
        sentinels = [(str(h), int(p)) for h, p in self.dataservice_sentinels] or [
            (params["host"], params["port"])
        ]
        manager = redis.sentinel.Sentinel(
            sentinels,
            min_other_sentinels=getattr(self, "min_other_sentinels", 0),
            sentinel_kwargs=getattr(self, "sentinel_kwargs", None),
            **options,
        )
        self.sentinels_made(manager)
        # Where kombu's own disconnect closes the Sentinel clients.
        if asynchronous:
            self._async_sentinel_manager = manager
        else:
            self._sentinel_manager = manager
        primary = getattr(self, "master_name", None)
        if primary is None:
            raise ValueError("'master_name' transport option must be specified.")
        credentials = {k: options[k] for k in ("username", "password") if k in options}
        return manager.master_for(primary, redis.Redis, **credentials).connection_pool


class RedisUnixChannel(RedisChannel):
    """:class:`RedisChannel` on a Unix socket (``unix://``): its pools'
    connections are made from the URL as redis-py's own clients make them
    from it, of :attr:`~RedisChannel.redis_connection_class`, which must be
    redis-py's ``UnixDomainSocketConnection`` or a subclass."""

    redis_connection_class: ClassVar[
        type[redis.Connection] | type[redis.UnixDomainSocketConnection]
    ] = redis.UnixDomainSocketConnection
    redis_ssl_connection_class: ClassVar[type[redis.SSLConnection] | None] = None

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        params = super()._connparams(asynchronous=asynchronous)
        for tcp_only in ("socket_keepalive", "socket_keepalive_options"):
            params.pop(tcp_only, None)
        # The whole URL: RedisUnixTransport has kombu keep it as the hostname.
        return {**params, **url_options(str(self.connection.client.hostname))}


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`RedisChannel`."""

    Channel = RedisChannel


class RedisUnixTransport(RedisTransport):
    """The same on a Unix socket: the connection's URL is ``unix://``."""

    can_parse_url = True
    Channel = RedisUnixChannel

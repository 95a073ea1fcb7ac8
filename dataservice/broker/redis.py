"""Redis as the broker (``redis://``, ``rediss://``, ``unix://``, and a
Sentinel-managed primary at ``sentinel://`` or, over TLS, ``sentinels://``):
kombu's Redis transport (or its Sentinel transport), with admission in the
channel.

The broker is always reached through :class:`RedisTransport`, over
``redis://`` and ``rediss://`` alike, or on ``unix://`` through its twin
:class:`UnixTransport`, so admission and caller pacing hold whichever is
used (kombu's own Unix-socket form, ``redis+socket://``, would take kombu's
stock transport: :mod:`dataservice.compat.kombu`). With ``rediss://`` the connection is TLS with the
certificate options of the URL's query (:mod:`dataservice.redis.tls`); given none,
the server's certificate must verify against the system CAs and match its
host name (``ssl_cert_reqs=required``), where kombu on its own would accept
any certificate. The options reach kombu as ``broker_use_ssl`` and are
removed from the URL it sees, so they are read one way only.

A lane's message is pushed by the admission script (``limits/admit.lua``),
which checks and pushes in one atomic step: a publish that is cancelled or
times out either queued its message or did not.

On ``sentinel://`` (:mod:`dataservice.redis.endpoints`) the channels are the
same with kombu's Sentinel channel beneath: their pools ask the Sentinels for
the primary, and the URL reaches kombu in its own form (the first Sentinel;
every Sentinel in ``dataservice_sentinels``, the primary's name as the
transport option ``master_name``). On ``sentinels://`` the URL's TLS options
reach kombu as ``broker_use_ssl`` for the primary, as with ``rediss://``, and
in ``sentinel_kwargs`` for the Sentinels.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import redis
from kombu.exceptions import LimitExceeded
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.backoff import NoBackoff
from redis.retry import Retry

from dataservice.broker import library
from dataservice.broker.base import (
    CONNECT_TIMEOUT_S,
    Admit,
    AsyncPublisher,
    Broker,
    Peek,
    Request,
)
from dataservice.broker.pipelined import AsyncBooks
from dataservice.compat import kombu as kombu_compat
from dataservice.config.model import Config
from dataservice.limits.admission import (
    OPS_HEADER,
    SIZE_HEADER,
    AdmissionRefused,
    LaneAdmission,
    admit,
    admitted,
    caller_pacing,
    envelope_size,
    lane_admissions,
)
from dataservice.limits.pacing import Pacing
from dataservice.redis import endpoints, where
from dataservice.redis.bounded import (
    QUIET,
    BoundedConnection,
    BoundedSSLConnection,
    BoundedUnixConnection,
)
from dataservice.redis.endpoints import (
    SENTINEL_PORT,
    SENTINEL_SCHEMES,
    SENTINEL_TIMEOUT_S,
    SentinelTarget,
    is_sentinel,
    sentinel_connection_class,
)
from dataservice.redis.keys import EPOCH_KEY
from dataservice.redis.packing import (
    ConnectionClass,
    PackedConnection,
    PackedSSLConnection,
    PackedUnixConnection,
    uses_unix_socket,
)
from dataservice.redis.tls import redis_tls, without_tls_options
from dataservice.tcp import KEEPALIVE

# Broker connections a sync client publishes on, however many of its threads
# publish at once: a publish holds one for a round trip, far less than the
# rest of a call costs its thread. (Each holds two Redis connections: kombu
# checks a new channel on a pool of its own.)
PUBLISH_CONNECTIONS = 1
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", *SENTINEL_SCHEMES)


class _Channel(kombu_compat.RedisChannel):
    """kombu's Redis channel, with admission.

    - A message for a lane queue is pushed by the admission script, which
      refuses it when the queue is full or too long for its deadline (see
      :mod:`dataservice.limits.admission`): the publish raises
      :class:`~dataservice.errors.ResourceExhausted`, whoever publishes;
      other messages (control replies) go as usual.
    - The record of a lane message's delivery waits for the task's strategy
      (``dataservice/worker/fastpath.py``): a message the worker answers and acknowledges
      at once needs none (its answer and its acknowledgement are one step).
    """

    # Commands packed by hiredis in one call (dataservice.redis.packing).
    redis_connection_class: ClassVar[ConnectionClass] = PackedConnection
    redis_ssl_connection_class: ClassVar[type[redis.SSLConnection] | None] = PackedSSLConnection
    redis_options = QUIET

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.connection.client.transport_options
        lanes = options.get("dataservice_admission") or {}
        self._admission = {queue: LaneAdmission(**lane) for queue, lane in lanes.items()}
        self.lane_queues = frozenset(self._admission)
        self._pacing = Pacing(options.get("dataservice_pacing") or {})

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

    def publish_request(self, request: Request, config: Config) -> str:
        """Publish ``request`` through the publish interface (``publish.lua``:
        the message built and admitted in Redis) and return the broker's
        epoch, or raise :class:`AdmissionRefused` (or ``redis.RedisError``)."""
        answer = library.publish(self.redis_client(), publish_args(request, self._pacing), config)
        return admitted(answer, self._pacing, request.caller)

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

    redis_connection_class: ClassVar[ConnectionClass] = BoundedConnection
    redis_ssl_connection_class: ClassVar[type[redis.SSLConnection] | None] = BoundedSSLConnection

    def client_factory(self) -> Any:
        return functools.partial(redis.Redis, retry=Retry(NoBackoff(), 0))


class CallerRedisTransport(RedisTransport):
    """The transport of clients (publishers that hold deadlines), not of workers."""

    Channel = _CallerChannel


class _UnixChannel(_Channel, kombu_compat.RedisUnixChannel):
    """:class:`_Channel` on a Unix socket (``unix://``)."""

    redis_connection_class: ClassVar[ConnectionClass] = PackedUnixConnection
    redis_ssl_connection_class = None


class UnixTransport(kombu_compat.RedisUnixTransport):
    Channel = _UnixChannel


class _CallerUnixChannel(_CallerChannel, _UnixChannel):
    redis_connection_class = BoundedUnixConnection
    redis_ssl_connection_class = None


class CallerUnixTransport(UnixTransport):
    Channel = _CallerUnixChannel


class _SentinelChannel(_Channel, kombu_compat.RedisSentinelChannel):
    """:class:`_Channel` on a Sentinel-managed primary."""

    redis_connection_class = sentinel_connection_class(PackedConnection)
    redis_ssl_connection_class = sentinel_connection_class(PackedSSLConnection)


class SentinelTransport(RedisTransport):
    default_port = SENTINEL_PORT  # type: ignore[assignment]  # kombu's stubs say None
    Channel = _SentinelChannel


class _CallerSentinelChannel(_CallerChannel, kombu_compat.RedisSentinelChannel):
    redis_connection_class = sentinel_connection_class(BoundedConnection)
    redis_ssl_connection_class = sentinel_connection_class(BoundedSSLConnection)

    def sentinels_made(self, manager: redis.sentinel.Sentinel) -> None:
        # Finding the primary is part of the publish: it keeps to its bound.
        endpoints.bound_sentinels(manager, bool(self.connection.client.ssl))


class CallerSentinelTransport(CallerRedisTransport):
    default_port = SENTINEL_PORT  # type: ignore[assignment]
    Channel = _CallerSentinelChannel


class _RedisDepths:
    def __init__(self, url: str, timeout_s: float) -> None:
        self._redis = endpoints.client(url, socket_timeout=timeout_s, **QUIET)

    def depth(self, queue: str) -> int:
        return int(self._redis.llen(queue))

    def close(self) -> None:
        self._redis.close()


def publish_args(request: Request, pacing: Pacing) -> list[Any]:
    """The publish interface's arguments for ``request``: held to its
    caller's rate unless this process's lease pays for it (a lease taken
    when the rate allows one)."""
    step = pacing.step(request.caller, request.ops)
    return library.publish_args(
        request.lane, request.request_id, request.caller, request.deadline_ms,
        request.operation, request.ops, request.body, -1 if step is None else step.lease,
    )  # fmt: skip


class _AsyncPublisher:
    """kombu has no asyncio producer, so this does what the sync channel does
    for a lane's request, and nothing more: it calls the publish interface,
    its calls pipelined (:class:`~.pipelined.AsyncBooks`). A test keeps what
    both publish identical."""

    def __init__(self, url: str, config: Config) -> None:
        self._books = AsyncBooks(url, config)
        self._pacing = Pacing(caller_pacing(config))

    async def admit(self, request: Request) -> str:
        args = publish_args(request, self._pacing)
        return await self._books.publish(args, self._pacing, request.caller)

    async def epoch(self) -> str | None:
        value = await self._books.client().get(EPOCH_KEY)
        return value.decode() if isinstance(value, bytes) else ""

    async def aclose(self) -> None:
        await self._books.aclose()


def _sentinel_options(target: SentinelTarget) -> dict[str, Any]:
    return {
        "master_name": target.primary,
        "dataservice_sentinels": [list(address) for address in target.sentinels],
        # kombu asks the Sentinels with these (else with the connection's
        # socket timeout, which a worker's blocking take leaves unset), over
        # TLS as the primary is: broker_use_ssl reaches only the primary.
        "sentinel_kwargs": {
            "socket_timeout": SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_TIMEOUT_S,
            **target.tls_options(),
        },
    }


class RedisBroker(Broker):
    name = "Redis"
    has_epoch = True
    has_library = True
    publish_connections = PUBLISH_CONNECTIONS
    errors = (redis.RedisError, KombuOperationalError, LimitExceeded, OSError)
    async_errors = (redis.RedisError, OSError, TimeoutError)

    def where(self) -> str:
        return f"Redis at {where(self.url)}"

    def unreachable(self, timeout_s: float) -> str:
        client = endpoints.client(
            self.url,
            **QUIET,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            client.ping()
        except redis.RedisError as exc:
            return type(exc).__name__
        finally:
            client.close()
        return ""

    def celery_settings(self, config: Config) -> dict[str, Any]:
        # A message not acknowledged within the visibility timeout is delivered
        # again; past the longest deadline a redelivery could only be dropped as
        # late, so by default the timeout sits just beyond it.
        visibility_s = config.broker.visibility_timeout_s or config.longest_deadline_ms // 1000 + 60
        # Naming the transport hides the scheme from kombu, and with it kombu's own
        # rediss:// handling; TLS comes from the URL's options, passed explicitly.
        sentinel = (
            SentinelTarget.parse(self.url, "the broker URL") if is_sentinel(self.url) else None
        )
        tls = sentinel.tls if sentinel else redis_tls(self.url, "the broker URL")
        tls_options = tls.connection_options() if tls else None
        transport = (
            "SentinelTransport"
            if sentinel
            else "UnixTransport"
            if uses_unix_socket(self.url)
            else "RedisTransport"
        )
        return {
            "broker_url": sentinel.kombu_url() if sentinel else without_tls_options(self.url),
            # Always the service's: kombu's stock one would publish past admission.
            "broker_transport": f"{__name__}:{transport}",
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
                **(_sentinel_options(sentinel) if sentinel else {}),
            },
        }

    def caller_settings(self, conf: Any) -> None:
        if conf.broker_transport:
            caller = (
                "CallerSentinelTransport"
                if is_sentinel(self.url)
                else "CallerUnixTransport"
                if uses_unix_socket(self.url)
                else "CallerRedisTransport"
            )
            conf.broker_transport = f"{__name__}:{caller}"
            # A lost connection is made again on the next publish, once: kombu's
            # default would sleep between attempts, past any deadline.
            conf.broker_transport_options = {**conf.broker_transport_options, "max_retries": 0}

    def admitter(self, connection: Any, books: redis.Redis, config: Config) -> Admit:
        # The channel's own Redis calls keep to the publish's bound (within()).
        channel = connection.default_channel

        def admit_on_channel(request: Request, timeout_s: float) -> str:
            return channel.publish_request(request, config)  # type: ignore[no-any-return]

        return admit_on_channel

    def async_publisher(self, config: Config) -> AsyncPublisher:
        return _AsyncPublisher(self.url, config)

    def epoch(self, connection: Any) -> str | None:
        return str(connection.default_channel.epoch())

    def depths(self, timeout_s: float = 2.0) -> _RedisDepths:
        return _RedisDepths(self.url, timeout_s)

    def depths_elsewhere(self, timeout_s: float) -> None:
        return None

    def peek(self, queue: str, limit: int) -> Peek:
        client = endpoints.client(self.url, **QUIET, socket_timeout=CONNECT_TIMEOUT_S)
        try:
            with client.pipeline(transaction=False) as pipe:
                pipe.llen(queue)
                pipe.lrange(queue, -limit, -1)
                total, raw = pipe.execute()
        finally:
            client.close()
        return Peek(int(total), list(reversed(raw)))

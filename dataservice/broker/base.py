"""What the service needs of a broker, whichever it is.

One implementation per broker, each in a module of its own
(:mod:`.redis`, :mod:`.rabbitmq`), chosen once from the settings by
:func:`dataservice.broker.broker_for`. Nothing outside this package asks
which broker is in use: it asks the broker.

- **Celery**: the broker's part of the Celery settings (URL, transport,
  TLS, its options, the lanes' queues).
- **Publishing**, sync and asyncio: admit a request message to a lane and
  queue it, or raise :class:`~dataservice.limits.admission.AdmissionRefused`.
  On Redis the admission script pushes the message itself; on RabbitMQ it
  records the request, the message is published and confirmed, and a publish
  that does not go is taken back out of admission's books.
- **Lost requests**: the broker's epoch, which changes when it restarts
  empty (a Redis keeps nothing on disk); a broker that keeps its queues has
  none, and a client never reports a request lost on it.
- **Depths**, **reachability** and **inspection** of what waits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import redis

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName

# A publish's wait for the broker to accept a connection.
CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Request:
    """One request to publish, in the protocol's terms (docs/protocol.md):
    the lane and its queue, the signed request (the task's body), its id,
    the caller, the deadline (Unix ms), the operation ('' if unknown) and how
    many operations it carries. ``reply_to``: the Celery reply address of the
    message a broker that needs one builds (:mod:`.message`)."""

    lane: LaneName
    queue: str
    body: bytes
    request_id: str
    caller: str
    deadline_ms: int
    operation: str
    ops: int
    reply_to: str


# Admit and queue one request (the seconds the publish may take); returns the
# broker's epoch ('' when it has none).
Admit = Callable[[Request, float], str]


class QueueDepths(Protocol):
    """How many messages wait in a lane's queue."""

    def depth(self, queue: str) -> int: ...

    def close(self) -> None: ...


class AsyncPublisher(Protocol):
    """Admits and queues request messages from coroutines of one event loop."""

    async def admit(self, request: Request) -> str:
        """As :data:`Admit`, bounded by the caller (``asyncio.timeout``)."""
        ...

    async def epoch(self) -> str | None:
        """The broker's epoch now (None: it has none, or did not say)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Peek:
    """What waits in a queue: how many, and the oldest entries as stored
    (None: the broker shows a message only by delivering it)."""

    total: int
    entries: list[bytes] | None


class Broker(ABC):
    """The broker at ``settings.broker_url``."""

    #: Its name, for operators ("Redis", "RabbitMQ").
    name: ClassVar[str]
    #: Whether the broker has an epoch (:meth:`epoch`): a client watches it
    #: for requests lost in a restart.
    has_epoch: ClassVar[bool]
    #: Whether requests are published through the publish interface on the
    #: broker's Redis (:mod:`.library`), which the workers install.
    has_library: ClassVar[bool] = False
    #: Broker connections a sync client publishes on, however many threads do.
    publish_connections: ClassVar[int]
    #: What a call on the broker may raise besides a refusal (it is down, a
    #: connection was lost, a socket timed out).
    errors: ClassVar[tuple[type[BaseException], ...]]
    #: The same, on the asyncio path.
    async_errors: ClassVar[tuple[type[BaseException], ...]]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = settings.broker_url

    @abstractmethod
    def where(self) -> str:
        """Where the broker is, for an operator (no credentials)."""

    @abstractmethod
    def unreachable(self, timeout_s: float) -> str:
        """Why the broker does not answer within ``timeout_s`` ('' when it does)."""

    @abstractmethod
    def celery_settings(self, config: Config) -> dict[str, Any]:
        """The broker's part of the Celery settings (:func:`.celery.celery_settings`)."""

    @abstractmethod
    def caller_settings(self, conf: Any) -> None:
        """Adjust a caller's Celery app (``conf``) so that a publish keeps to
        its deadline (see :func:`.celery.celery_app`)."""

    @abstractmethod
    def admitter(self, connection: Any, books: redis.Redis, config: Config) -> Admit:
        """How a message is admitted and queued on ``connection`` (a pooled
        kombu connection of the caller's app); ``books``: admission's Redis."""

    @abstractmethod
    def async_publisher(self, config: Config) -> AsyncPublisher:
        """A publisher for one event loop (connects on first use)."""

    def epoch(self, connection: Any) -> str | None:
        """The broker's epoch, asked on ``connection`` (None: it has none)."""
        return None

    @abstractmethod
    def depths(self, timeout_s: float = 2.0) -> QueueDepths:
        """Counts of what waits in each queue (connects on first use)."""

    def depths_elsewhere(self, timeout_s: float) -> QueueDepths | None:
        """:meth:`depths` where the queues are not lists on admission's Redis
        (None: the gauges count them with admission's books, in one round trip)."""
        return self.depths(timeout_s)

    @abstractmethod
    def peek(self, queue: str, limit: int) -> Peek:
        """Up to ``limit`` of the oldest messages in ``queue``, none taken."""

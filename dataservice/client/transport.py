"""The client's side of the wire: publish an envelope to a lane, await its answer.

Messages follow Celery's task protocol, so any Celery worker or tool reads
them; the client builds each one itself (:mod:`.message`) and hands it to
the broker's admission (:meth:`~dataservice.broker.base.Broker.admitter`) on
a connection from Celery's connection pool. The publish itself is
:mod:`.publishing`'s, shared with the asyncio transport. A client's answers
come back on its reply channel (:class:`~.inbox.Inbox`), whose slot for each
request is made before the request is published. No Celery type leaves this
module.
"""

from __future__ import annotations

from collections.abc import Iterable

from dataservice.broker import broker_for
from dataservice.broker.celery import celery_app
from dataservice.broker.results import ResultStore
from dataservice.client.inbox import Inbox
from dataservice.client.publishing import Epochs, Item, Publish
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import InternalError
from dataservice.limits.admission import AdmissionRefused
from dataservice.plans import Driver
from dataservice.redis.bounded import SLACK_S, left, within


class Transport:
    """``caller``: the caller whose reply channel (:attr:`inbox`) receives the
    answers; without one, answers are read from :attr:`results`, under each
    request's own key, by whoever published it."""

    def __init__(
        self, settings: Settings, config: Config, *, caller: str = "", max_waiters: int = 4
    ) -> None:
        self.config = config
        self._broker = broker_for(settings)
        self._app = celery_app("dataservice-client", settings, config, caller=True)
        # A pool of its own: the app's (broker_pool_limit) resizes every kombu
        # pool in the process, a worker's included.
        self._connection = self._app.connection_for_write()
        self._pool = self._connection.Pool(limit=self._broker.publish_connections)
        # Made lazily, as every pool here: a client that never reads a key
        # this way holds no connection for it.
        self.results = ResultStore.from_url(
            settings.result_backend_url, max_waiters=max_waiters, bounded=True
        )
        self.inbox = Inbox(settings.result_backend_url, caller) if caller else None
        self._grace_s = config.results.grace_ms / 1000
        self._reply_to = self._app.thread_oid
        self.epochs = Epochs()

    def publish(
        self,
        body: bytes,
        *,
        request_id: str,
        lane: LaneName,
        deadline_ms: int,
        caller: str = "",
        operation: str = "",
        ops: int = 1,
    ) -> str:
        """Publish one request (of ``ops`` operations); returns the broker's
        epoch it went out in."""
        return self.publish_many(
            [(body, request_id, deadline_ms, operation, ops)], lane=lane, caller=caller
        )

    def publish_many(self, items: Iterable[Item], *, lane: LaneName, caller: str = "") -> str:
        """Publish in order (:class:`~.publishing.Publish`); returns the
        broker's epoch they went out in. With an :attr:`inbox`, each item's
        answer is expected there from just before it is pushed. ``caller``
        (when given) holds the messages to that caller's rate at admission,
        as the workers will; each item's operation (``read``, ...; '' if
        unknown) lets admission add what such a request takes to the queue's
        wait. Each item: the signed body, the message id, its deadline, its
        operation and how many operations it carries (a batch's many:
        admission counts operations)."""
        queue = self.config.lanes[lane].queue
        publish = Publish(items, lane, queue, caller, self._reply_to, self.inbox, self._grace_s)
        refusal = None
        try:
            # Only a channel is needed: a pooled connection, waited for no
            # longer than the deadline allows.
            with (
                within(publish.left_s + SLACK_S),
                self._pool.acquire(block=True, timeout=left()) as connection,
            ):
                admit = self._broker.admitter(connection, self.results.client, self.config)
                try:
                    return Driver(publish.plan()).run(lambda request: admit(request, left() or 0.0))
                except AdmissionRefused as refused:
                    # Raised once the connection is back in its pool: kombu
                    # closes a connection an exception leaves its block through.
                    refusal = refused
        except self._broker.errors:
            raise publish.failed() from None
        raise refusal

    @property
    def replies(self) -> Inbox:
        """The reply channel, for a transport that has one."""
        if self.inbox is None:
            raise InternalError(
                "this transport has no reply channel (it was made without a caller)"
            )
        return self.inbox

    def ended_for(self, epoch: str) -> float | None:
        """How long ago this client first saw that the broker's epoch is no
        longer ``epoch`` (None: not seen); asks nothing of the broker."""
        return self.epochs.ended_for(epoch)

    def look_at_epoch(self, epoch: str, deadline_ms: int) -> None:
        """Ask the broker for its epoch (within ``deadline_ms``, Unix ms), if
        a look is due; a broker that cannot say tells nothing."""
        left_s = self.epochs.may_ask(epoch, deadline_ms)
        if not left_s or not self._broker.has_epoch:
            return
        try:
            with (
                within(left_s),
                self._pool.acquire(block=True, timeout=left()) as connection,
            ):
                now = self._broker.epoch(connection)
        except self._broker.errors:
            return
        if now is not None:
            self.epochs.saw(epoch, now)

    def close(self) -> None:
        if self.inbox is not None:
            self.inbox.close()
        self.results.close()
        self._pool.force_close_all()
        self._connection.release()
        self._app.close()

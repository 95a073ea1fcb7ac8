"""The asyncio client's side of the wire: the same messages through the same
admission as :mod:`.transport`, on the broker's asyncio publisher
(:meth:`~dataservice.broker.base.Broker.async_publisher`: on Redis one task
per client sends the admission script's calls in pipelines; on RabbitMQ the
admitted message is published with aio-pika and its confirm awaited). The
publish itself is :mod:`.publishing`'s, shared with the sync transport. A
publish cancelled midway either queued its message or did not; its slot on
the reply channel goes either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from dataservice.broker import broker_for
from dataservice.client.inbox import AsyncInbox
from dataservice.client.publishing import Epochs, Item, Publish
from dataservice.compat.kombu import reply_address
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.plans import Driver
from dataservice.redis.bounded import SLACK_S


class AsyncTransport:
    """The wire of :class:`~dataservice.AsyncClient`. Its publisher holds one
    or two connections (see the broker's), and the reply channel's reader one."""

    def __init__(self, settings: Settings, config: Config, *, caller: str) -> None:
        self.config = config
        self.inbox = AsyncInbox(settings.result_backend_url, caller)
        self._broker = broker_for(settings)
        self._publisher = self._broker.async_publisher(config)
        self._grace_s = config.results.grace_ms / 1000
        self._reply_to = reply_address(self)
        self.epochs = Epochs()

    @property
    def replies(self) -> AsyncInbox:
        return self.inbox

    async def publish_many(self, items: Iterable[Item], *, lane: LaneName, caller: str = "") -> str:
        """As :meth:`.transport.Transport.publish_many`."""
        queue = self.config.lanes[lane].queue
        publish = Publish(items, lane, queue, caller, self._reply_to, self.inbox, self._grace_s)
        try:
            async with asyncio.timeout(publish.left_s + SLACK_S):
                return await Driver(publish.plan()).arun(self._publisher)
        except asyncio.CancelledError:
            publish.abandon()
            raise
        except self._broker.async_errors:
            raise publish.failed() from None

    def ended_for(self, epoch: str) -> float | None:
        return self.epochs.ended_for(epoch)

    async def look_at_epoch(self, epoch: str, deadline_ms: int) -> None:
        """As :meth:`.transport.Transport.look_at_epoch`."""
        left_s = self.epochs.may_ask(epoch, deadline_ms)
        if not left_s or not self._broker.has_epoch:
            return
        try:
            async with asyncio.timeout(left_s):
                now = await self._publisher.epoch()
        except self._broker.async_errors:
            return
        if now is not None:
            self.epochs.saw(epoch, now)

    async def aclose(self) -> None:
        await self._publisher.aclose()
        await self.inbox.aclose()

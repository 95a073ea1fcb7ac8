"""A publish, written once for both transports: items in, each made a
request, expected on the reply channel, admitted and queued, until one is
refused; then what was sent, what was refused and what is no longer waited
for. No I/O here: the publish is a plan (:mod:`dataservice.plans`) whose one
kind of step, :class:`Enqueue`, the sync transport runs on a pooled broker
connection and the asyncio one awaits on its publisher.

What a caller hears, whichever transport:

- admission refused an item: :class:`AdmissionRefused`, its ``sent`` the
  number of items that went before it, its ``epoch`` theirs; the rest are
  no longer waited for;
- the broker (or admission's Redis) failed: :class:`~dataservice.errors.Unavailable`
  (retryable), or :class:`~dataservice.errors.DeadlineExceeded` once the
  deadline has passed; none of the items' answers is waited for;
- the publish was cancelled (asyncio): the cancellation; none of the items'
  answers is waited for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from dataservice.broker.base import Request
from dataservice.enums import LaneName
from dataservice.errors import DeadlineExceeded, Unavailable
from dataservice.limits.admission import AdmissionRefused

RETRY_BROKER_DOWN_S = 0.5
_EPOCHS_KEPT = 8
# The broker's epoch is asked at most this often (s), however many calls wait.
_EPOCH_EVERY_S = 0.5
# One message for the transport: the signed body, the message id, its
# deadline, its operation and how many operations it carries.
Item = tuple[bytes, str, int, str, int]


class Expecting(Protocol):
    """A reply channel, as a publish uses it."""

    def expect(self, request_id: str, lapses_in_s: float) -> None: ...

    def forget(self, request_id: str) -> None: ...


class Epochs:
    """The broker epochs a client has seen end, and when (monotonic): shared
    by every handle of the client, so a backlog lost in one restart is
    reported in one grace period, not one per handle. However many calls
    wait, the broker is asked at most once per ``_EPOCH_EVERY_S``."""

    def __init__(self) -> None:
        self._ended: dict[str, float] = {}
        self._asked = 0.0
        self._lock = threading.Lock()

    def ended_for(self, epoch: str) -> float | None:
        """How long ago the broker's epoch was first seen to differ from
        ``epoch`` (None: not seen)."""
        with self._lock:
            seen = self._ended.get(epoch)
        return None if seen is None else time.monotonic() - seen

    def may_ask(self, epoch: str, deadline_ms: int) -> float:
        """Seconds a look at the broker's epoch may take now (0: none is due)."""
        left_s = (deadline_ms - time.time() * 1000) / 1000
        if left_s <= 0 or self.ended_for(epoch) is not None:
            return 0.0
        with self._lock:
            if time.monotonic() - self._asked < _EPOCH_EVERY_S:
                return 0.0
            self._asked = time.monotonic()
        return left_s

    def saw(self, epoch: str, now: str) -> None:
        """The broker said its epoch is ``now``."""
        if now == epoch:
            return
        with self._lock:
            self._ended.setdefault(epoch, time.monotonic())
            # Epochs end once per Redis restart: a few are plenty to remember.
            while len(self._ended) > _EPOCHS_KEPT:
                del self._ended[next(iter(self._ended))]


def broker_failure(deadline_ms: int) -> DeadlineExceeded | Unavailable:
    """What a caller hears of a publish the broker did not take: its deadline
    passed meanwhile, or the broker is unreachable (retryably)."""
    if time.time() * 1000 >= deadline_ms:
        return DeadlineExceeded("the deadline passed before the broker answered")
    return Unavailable("the broker is unreachable", retry_after=RETRY_BROKER_DOWN_S)


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Admit one request to its lane's queue; gives the broker's epoch."""

    request: Request

    def run(self, admit: Any) -> str:
        """On a sync transport: ``admit`` the broker's
        :data:`~dataservice.broker.base.Admit` on a pooled connection, its
        time bound taken."""
        return admit(self.request)  # type: ignore[no-any-return]

    async def arun(self, publisher: Any) -> str:
        """On an asyncio transport: ``publisher`` is the broker's
        :class:`~dataservice.broker.base.AsyncPublisher`."""
        return await publisher.admit(self.request)  # type: ignore[no-any-return]


class Publish:
    """One publish of ``items`` to ``queue``, in order (see the module)."""

    def __init__(
        self,
        items: Iterable[Item],
        lane: LaneName,
        queue: str,
        caller: str,
        reply_to: str,
        inbox: Expecting | None,
        grace_s: float,
    ) -> None:
        self._items = list(items)
        self._lane = lane
        self._queue = queue
        self._caller = caller
        self._reply_to = reply_to
        self._inbox = inbox
        self._grace_s = grace_s
        # Every call of the publish, and the wait for a connection, keeps to
        # the earliest deadline among the items.
        self.deadline_ms = min((item[2] for item in self._items), default=0)

    @property
    def left_s(self) -> float:
        """Seconds until the earliest deadline (0 once it passed)."""
        return max((self.deadline_ms - time.time() * 1000) / 1000, 0.0)

    def plan(self) -> Generator[Enqueue, str, str]:
        """Each item enqueued in turn; returns the broker's epoch they went
        out in, or raises the first refusal (see the module)."""
        epoch = ""
        for sent, (body, request_id, deadline_ms, operation, ops) in enumerate(self._items):
            request = Request(
                self._lane, self._queue, body, request_id, self._caller, deadline_ms,
                operation, ops, self._reply_to,
            )  # fmt: skip
            if self._inbox is not None:
                # Expected from just before it is pushed: an answer can come
                # before the push returns.
                lapses_in_s = (deadline_ms - time.time() * 1000) / 1000
                self._inbox.expect(request_id, lapses_in_s + self._grace_s)
            try:
                epoch = yield Enqueue(request)
            except AdmissionRefused as refusal:
                self._forget(self._items[sent:])
                refusal.sent, refusal.epoch = sent, epoch
                raise
            except Exception:
                self._forget(self._items)
                raise
        return epoch

    def failed(self) -> DeadlineExceeded | Unavailable:
        """The broker failed: whatever went out before, its caller hears only
        the failure, and none of the answers is waited for."""
        self.abandon()
        return broker_failure(self.deadline_ms)

    def abandon(self) -> None:
        """None of the answers is waited for (a cancelled publish)."""
        self._forget(self._items)

    def _forget(self, items: list[Item]) -> None:
        if self._inbox is not None:
            for item in items:
                self._inbox.forget(item[1])

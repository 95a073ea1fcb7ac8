"""One reply channel of a client: every answer to its calls on one Redis list,
read by one reader and handed to the call that waits for it.

A request that names the channel (``RequestEnvelope.reply_channel``) is
answered on ``ds:reply:<caller>:<channel>`` (docs/protocol.md, "Reply
channels"). The reader takes answers off that list with ``BLMPOP`` (up to
:data:`TAKE` at once) over a connection of its own, reads the request id each
answer carries and hands it to the slot registered for that id
(:meth:`Slots.expect`, before the request is published, so an answer never
arrives before its slot). However many calls wait, the channel costs one
connection.

Some answers cannot use the channel: a refusal written before the request's
signature was checked (the channel's name is not trusted until then), or one
from a worker that predates reply channels. They come under the request's own
key (``ds:result:<caller>:<id>``). The reader looks there for every slot
still empty 1, 2, 4, 8, ... seconds after it was made, all due looks in one
round trip: a call answered that way hears within about twice the time its
answer took, at a handful of looks per call.

Bounded in every way: a wait ends at its timeout; a slot nobody collects
lapses at its deadline plus the grace; an answer with no slot (its call gave
up, or it was not ours) is dropped and counted. A reader that cannot reach
Redis keeps trying, a pause at a time, and the calls waiting meanwhile are
told :class:`~dataservice.errors.Unavailable` rather than left to their
deadline.

:class:`Slots` is the bookkeeping, without I/O; :class:`Inbox` reads with a
thread, :class:`AsyncInbox` with an asyncio task.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import redis
from redis.asyncio import Redis as AsyncRedis

from dataservice.errors import Unavailable
from dataservice.proto import pb
from dataservice.redis import endpoints
from dataservice.redis.bounded import QUIET
from dataservice.redis.keys import reply_key, result_key
from dataservice.redis.tasks import stop_task

__all__ = ["AsyncInbox", "Inbox", "Slots", "request_id_of"]

log = logging.getLogger(__name__)

# The longest single blocking read: how soon the reader sees a close, sweeps
# lapsed slots and makes its due looks.
SLICE_S = 0.5
# After a failed read, how long the reader waits before the next.
PAUSE_S = 0.2
RETRY_READER_DOWN_S = 0.5
# Answers taken off the channel in one read.
TAKE = 256
# The first look under a request's own key, after its slot was made; each
# later look waits twice as long as the one before.
FIRST_LOOK_S = 1.0


class Signal(Protocol):
    """What wakes a waiting call: :class:`Arrival` or ``asyncio.Event``."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


S = TypeVar("S", bound=Signal)


@dataclass(slots=True)
class Slot(Generic[S]):
    lapses_at: float  # monotonic
    arrived: S
    look_at: float  # monotonic: the next look under the request's own key
    look_every: float = FIRST_LOOK_S
    body: bytes = b""


def request_id_of(body: bytes) -> str:
    """The request id an encoded ``ResponseEnvelope`` answers ('' if none).

    Field 1, written first by every protobuf serializer that writes fields in
    number order, is read straight from the bytes; anything else is parsed."""
    if len(body) >= 2 and body[0] == 0x0A and body[1] < 0x80 and len(body) >= 2 + body[1]:
        try:
            return body[2 : 2 + body[1]].decode("ascii")
        except UnicodeDecodeError:
            return ""
    try:
        return pb.ResponseEnvelope.FromString(body).request_id
    except Exception:
        return ""


class Arrival:
    """A slot's signal for a waiting thread, set once: a lock held from the
    start and released by :meth:`set`. ``threading.Event`` builds a condition
    (two locks) per slot, and its ``set`` and ``wait`` go through it in
    Python, on the reader thread and the caller's (bench/results/caller-cpu.md)."""

    __slots__ = ("_done", "_lock")

    def __init__(self) -> None:
        self._done = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        # Slots.hand_over fills a slot once, so it is set once.
        self._done = True
        self._lock.release()

    def is_set(self) -> bool:
        return self._done

    def wait(self, timeout: float) -> bool:
        """Whether it is set, waiting up to ``timeout`` seconds for it."""
        if self._done:
            return True
        if self._lock.acquire(timeout=max(timeout, 0.0)):
            # Released again for any other thread waiting on the same slot.
            self._lock.release()
            return True
        return self._done


class Slots(Generic[S]):
    """The answers a channel's calls expect: made before each request is sent,
    filled by the reader, taken by the call (or lapsed, or dropped).

    Thread-safe. Holds no connection and does no I/O: the reader passes it
    what it read and asks it which request keys are due a look."""

    def __init__(self, caller: str, channel: str | None = None) -> None:
        self.caller = caller
        # The request id's rule: letters, digits, '_' and '-' (22 of them).
        self.channel = channel or secrets.token_urlsafe(16)
        self.key = reply_key(caller, self.channel)
        self._slots: dict[str, Slot[S]] = {}
        self._lock = threading.Lock()
        self._swept_at = time.monotonic()
        #: Answers taken off the channel with no call waiting for them.
        self.dropped = 0
        #: Answers found under a request's own key.
        self.looked_up = 0

    def expect(self, request_id: str, lapses_in_s: float, arrived: S) -> None:
        now = time.monotonic()
        with self._lock:
            self._slots[request_id] = Slot(now + lapses_in_s, arrived, now + FIRST_LOOK_S)

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._slots.pop(request_id, None)

    def get(self, request_id: str) -> Slot[S] | None:
        with self._lock:
            return self._slots.get(request_id)

    def take(self, request_id: str) -> bytes | None:
        """The answer that arrived for ``request_id``, its slot gone (None:
        another wait took it first)."""
        with self._lock:
            slot = self._slots.pop(request_id, None)
        return None if slot is None else slot.body

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    def hand_over(self, bodies: Iterable[bytes], looked_up: bool = False) -> list[S]:
        """Fill the slots these answers are for; the signals to set (outside
        any lock the caller holds, on the loop or thread they belong to)."""
        woken: list[S] = []
        with self._lock:
            for body in bodies:
                slot = self._slots.get(request_id_of(body))
                if slot is None or slot.body:
                    self.dropped += 1
                    continue
                slot.body = body
                woken.append(slot.arrived)
                self.looked_up += looked_up
        return woken

    def due(self, now: float) -> list[str]:
        """Once a slice at most: sweep the lapsed slots, and name the keys of
        empty slots due a look under their request's own key."""
        if now - self._swept_at < SLICE_S:
            return []
        self._swept_at = now
        keys = []
        with self._lock:
            for request_id in [i for i, s in self._slots.items() if s.lapses_at <= now]:
                del self._slots[request_id]
            for request_id, slot in self._slots.items():
                if not slot.body and slot.look_at <= now:
                    slot.look_every *= 2
                    slot.look_at = now + slot.look_every
                    keys.append(result_key(self.caller, request_id))
        return keys


class Inbox:
    """A client's reply channel and the thread that reads it."""

    def __init__(self, url: str, caller: str, *, channel: str | None = None) -> None:
        self.slots: Slots[Arrival] = Slots(caller, channel)
        self.caller = caller
        self.channel = self.slots.channel
        # Its own connection (a blocking read holds it), as the caller's Redis
        # user; QUIET: that user may not announce the client library.
        self._redis = endpoints.client(
            url,
            max_connections=1,
            socket_timeout=SLICE_S + 3,
            socket_connect_timeout=2,
            **QUIET,
        )
        self._stop = threading.Event()
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None
        # The last read failed (and has not succeeded since).
        self._failing = False

    @property
    def dropped(self) -> int:
        """Answers taken off the channel with no call waiting for them."""
        return self.slots.dropped

    def expect(self, request_id: str, lapses_in_s: float) -> None:
        """Make room for the answer to ``request_id`` before it is sent; the
        room goes after ``lapses_in_s`` if nobody takes its answer."""
        self.slots.expect(request_id, lapses_in_s, Arrival())
        if self._thread is None:
            with self._start:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(
                        target=self._read, name=f"inbox-{self.caller}", daemon=True
                    )
                    self._thread.start()

    def forget(self, request_id: str) -> None:
        """Its answer is no longer wanted (the request was never sent, or its
        call gave up for good): one that comes is dropped."""
        self.slots.forget(request_id)

    @property
    def waiting(self) -> int:
        """Answers expected and not yet taken (nor lapsed)."""
        return len(self.slots)

    def expecting(self, request_id: str) -> bool:
        """Whether an answer to ``request_id`` may still be taken here."""
        return self.slots.get(request_id) is not None

    def ready(self, request_id: str) -> bool:
        slot = self.slots.get(request_id)
        return slot is not None and slot.arrived.is_set()

    def wait(self, request_id: str, timeout_s: float) -> bytes | None:
        """Take the answer to ``request_id``, waiting up to ``timeout_s``; None
        if it did not come (its slot stays: a later wait may still take it).
        Raises :class:`Unavailable` when the channel cannot be read."""
        slot = self.slots.get(request_id)
        if slot is None:
            return None
        until = time.monotonic() + max(timeout_s, 0.0)
        while not slot.arrived.wait(max(0.0, min(until - time.monotonic(), SLICE_S))):
            if self._failing:
                raise Unavailable(
                    "the result backend is unreachable", retry_after=RETRY_READER_DOWN_S
                )
            if time.monotonic() >= until:
                return None
        return self.slots.take(request_id)

    def close(self) -> None:
        """Stop the reader (answers it was taking are lost with it) and let go
        of its connection."""
        self._stop.set()
        with self._start:
            thread = self._thread
        until = time.monotonic() + SLICE_S + 1
        while thread is not None and thread.is_alive() and time.monotonic() < until:
            # Cut the reader's blocking read short rather than wait out its
            # slice (again, if it was still connecting the last time).
            self._redis.connection_pool.disconnect()
            thread.join(0.02)
        self._redis.close()
        self._redis.connection_pool.disconnect()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                popped = self._redis.blmpop(
                    SLICE_S, 1, self.slots.key, direction="LEFT", count=TAKE
                )
                if popped and isinstance(taken := popped[1], list):
                    self._wake(self.slots.hand_over(b for b in taken if isinstance(b, bytes)))
                due = self.slots.due(time.monotonic())
                if due:
                    self._look(due)
            except redis.RedisError as exc:
                if self._stop.is_set():
                    break
                if not self._failing:
                    log.warning("reply channel unreadable: %s", type(exc).__name__)
                self._failing = True
                self._stop.wait(PAUSE_S)
                continue
            self._failing = False

    def _look(self, keys: list[str]) -> None:
        with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lpop(key)
            found = [v for v in pipe.execute() if isinstance(v, bytes)]
        self._wake(self.slots.hand_over(found, looked_up=True))

    @staticmethod
    def _wake(signals: list[Arrival]) -> None:
        for signal in signals:
            signal.set()


class AsyncInbox:
    """A client's reply channel read by one asyncio task.

    The task alone touches its connection, and is cancelled only by
    :meth:`aclose`: a waiting call that is cancelled or times out stops
    waiting on its slot's event and nothing else, so it can neither break the
    connection nor take, or lose, another call's answer. (redis-py's asyncio
    client drops a connection whose command is cancelled, and a blocking pop
    cancelled after Redis popped loses the answer: neither can happen here.)
    Made and used inside one event loop.
    """

    def __init__(self, url: str, caller: str, *, channel: str | None = None) -> None:
        self.slots: Slots[asyncio.Event] = Slots(caller, channel)
        self.caller = caller
        self.channel = self.slots.channel
        self._url = url
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failing = False

    @property
    def dropped(self) -> int:
        return self.slots.dropped

    @property
    def waiting(self) -> int:
        return len(self.slots)

    def expect(self, request_id: str, lapses_in_s: float) -> None:
        """As :meth:`Inbox.expect` (called inside the client's event loop)."""
        self.slots.expect(request_id, lapses_in_s, asyncio.Event())
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._read(), name=f"inbox-{self.caller}"
            )

    def forget(self, request_id: str) -> None:
        self.slots.forget(request_id)

    def expecting(self, request_id: str) -> bool:
        return self.slots.get(request_id) is not None

    def ready(self, request_id: str) -> bool:
        slot = self.slots.get(request_id)
        return slot is not None and slot.arrived.is_set()

    async def wait(self, request_id: str, timeout_s: float) -> bytes | None:
        """As :meth:`Inbox.wait`."""
        slot = self.slots.get(request_id)
        if slot is None:
            return None
        until = time.monotonic() + max(timeout_s, 0.0)
        while not slot.arrived.is_set():
            if self._failing:
                raise Unavailable(
                    "the result backend is unreachable", retry_after=RETRY_READER_DOWN_S
                )
            left = until - time.monotonic()
            if left <= 0:
                return None
            try:
                async with asyncio.timeout(min(left, SLICE_S)):
                    await slot.arrived.wait()
            except TimeoutError:
                continue
        return self.slots.take(request_id)

    async def aclose(self) -> None:
        """Stop the reader and let go of its connection."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task, SLICE_S + 1, "reply channel reader")

    async def _read(self) -> None:
        client = endpoints.async_client(
            self._url,
            max_connections=1,
            socket_timeout=SLICE_S + 3,
            socket_connect_timeout=2,
            **QUIET,
        )
        try:
            while not self._closed:
                try:
                    popped = await client.blmpop(
                        SLICE_S, 1, self.slots.key, direction="LEFT", count=TAKE
                    )
                    if popped and isinstance(taken := popped[1], list):
                        self._wake(self.slots.hand_over(b for b in taken if isinstance(b, bytes)))
                    due = self.slots.due(time.monotonic())
                    if due:
                        await self._look(client, due)
                except (redis.RedisError, OSError) as exc:
                    # redis-py may turn the cancellation of a command into
                    # an error of its own.
                    if self._closed:
                        break
                    if not self._failing:
                        log.warning("reply channel unreadable: %s", type(exc).__name__)
                    self._failing = True
                    await asyncio.sleep(PAUSE_S)
                    continue
                self._failing = False
        finally:
            await client.aclose()
            await client.connection_pool.disconnect()

    async def _look(self, client: AsyncRedis, keys: list[str]) -> None:
        async with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lpop(key)
            found = [v for v in await pipe.execute() if isinstance(v, bytes)]
        self._wake(self.slots.hand_over(found, looked_up=True))

    @staticmethod
    def _wake(signals: list[asyncio.Event]) -> None:
        for signal in signals:
            signal.set()

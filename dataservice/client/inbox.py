"""One reply channel of a client: every answer to its calls on one Redis list,
read by one thread and handed to the call that waits for it.

A request that names the channel (``RequestEnvelope.reply_channel``) is
answered on ``ds:reply:<caller>:<channel>`` (docs/protocol.md, "Reply
channels"). The reader takes each answer off that list with ``BLPOP`` over a
connection of its own, reads the request id the answer carries and hands it
to the slot registered for that id (:meth:`Inbox.expect`, before the request
is published, so an answer never arrives before its slot). However many calls
wait, the channel costs one connection.

Bounded in every way: a wait ends at its timeout; a slot nobody collects
lapses at its deadline plus the grace; an answer with no slot (its call gave
up, or it was not ours) is dropped and counted. A reader that cannot reach
Redis keeps trying, a pause at a time, and the calls waiting meanwhile are
told :class:`~dataservice.errors.Unavailable` rather than left to their
deadline.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

import redis

from dataservice.bounded import QUIET
from dataservice.errors import Unavailable
from dataservice.keys import reply_key
from dataservice.proto import pb

__all__ = ["Inbox"]

log = logging.getLogger(__name__)

# The longest single BLPOP: how soon the reader sees a close or sweeps lapsed slots.
_SLICE_S = 0.5
# After a failed read, how long the reader waits before the next.
_PAUSE_S = 0.2
RETRY_READER_DOWN_S = 0.5


@dataclass(slots=True)
class _Slot:
    lapses_at: float  # monotonic
    arrived: threading.Event = field(default_factory=threading.Event)
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


class Inbox:
    """A client's reply channel and the thread that reads it."""

    def __init__(self, url: str, caller: str, *, channel: str | None = None) -> None:
        self.caller = caller
        # The request id's rule: letters, digits, '_' and '-' (22 of them).
        self.channel = channel or secrets.token_urlsafe(16)
        self._key = reply_key(caller, self.channel)
        # Its own connection (a BLPOP holds it), as the caller's Redis user;
        # QUIET: that user may not announce the client library.
        self._redis = redis.Redis.from_url(
            url,
            max_connections=1,
            socket_timeout=_SLICE_S + 3,
            socket_connect_timeout=2,
            **QUIET,
        )
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The last read failed (and has not succeeded since).
        self._failing = False
        self._swept_at = time.monotonic()
        #: Answers taken off the channel with no call waiting for them.
        self.dropped = 0

    def expect(self, request_id: str, lapses_in_s: float) -> None:
        """Make room for the answer to ``request_id`` before it is sent; the
        room goes after ``lapses_in_s`` if nobody takes its answer."""
        with self._lock:
            self._slots[request_id] = _Slot(time.monotonic() + lapses_in_s)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._read, name=f"inbox-{self.caller}", daemon=True
                )
                self._thread.start()

    def forget(self, request_id: str) -> None:
        """Its answer is no longer wanted (the request was never sent)."""
        with self._lock:
            self._slots.pop(request_id, None)

    @property
    def waiting(self) -> int:
        """Answers expected and not yet taken (nor lapsed)."""
        with self._lock:
            return len(self._slots)

    def ready(self, request_id: str) -> bool:
        with self._lock:
            slot = self._slots.get(request_id)
        return slot is not None and slot.arrived.is_set()

    def wait(self, request_id: str, timeout_s: float) -> bytes | None:
        """Take the answer to ``request_id``, waiting up to ``timeout_s``; None
        if it did not come (its slot stays: a later wait may still take it).
        Raises :class:`Unavailable` when the channel cannot be read."""
        with self._lock:
            slot = self._slots.get(request_id)
        if slot is None:
            return None
        until = time.monotonic() + max(timeout_s, 0.0)
        while not slot.arrived.wait(max(0.0, min(until - time.monotonic(), _SLICE_S))):
            if self._failing:
                raise Unavailable(
                    "the result backend is unreachable", retry_after=RETRY_READER_DOWN_S
                )
            if time.monotonic() >= until:
                return None
        with self._lock:
            self._slots.pop(request_id, None)
        return slot.body

    def close(self) -> None:
        """Stop the reader (an answer it was taking is lost with it) and let go
        of its connection."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(_SLICE_S + 1)
        self._redis.close()
        self._redis.connection_pool.disconnect()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                popped = self._redis.blpop([self._key], timeout=_SLICE_S)
            except redis.RedisError as exc:
                if not self._failing:
                    log.warning("reply channel unreadable: %s", type(exc).__name__)
                self._failing = True
                self._stop.wait(_PAUSE_S)
                continue
            self._failing = False
            if popped is not None and isinstance(popped[1], bytes):
                self._hand_over(popped[1])
            self._sweep()

    def _hand_over(self, body: bytes) -> None:
        request_id = request_id_of(body)
        with self._lock:
            slot = self._slots.get(request_id)
            if slot is None or slot.arrived.is_set():
                self.dropped += 1
                return
            slot.body = body
        slot.arrived.set()

    def _sweep(self) -> None:
        # Once a slice at most: a sweep walks every slot.
        now = time.monotonic()
        if now - self._swept_at < _SLICE_S:
            return
        self._swept_at = now
        with self._lock:
            for request_id in [i for i, s in self._slots.items() if s.lapses_at <= now]:
                del self._slots[request_id]

"""What both clients share: who calls, how a call retries, how ``read_many``
splits and retries its reads. No I/O here: :class:`~.client.Client` and
:class:`~.async_client.AsyncClient` publish, wait and sleep, each its own way.

Interactive calls retry a retryable answer (``RESOURCE_EXHAUSTED``,
``UNAVAILABLE``) within their one deadline: at most
``client.retry.max_attempts`` attempts, each wait the answer's retry-after
plus a random share of an exponentially growing cap ("full jitter"), so
callers refused together do not come back together. Every attempt is a new
message with a new request id; a write or delete keeps its idempotency key
across attempts (the client always sets one), so a retry never applies a
change twice. A lane too full to serve the call in time (``queue_full``,
``queue_bytes``, ``queue_too_long``) is not retried: the caller hears at once.
The client's throttle (:mod:`.throttle`) may refuse a call before it is
sent (``throttled``), and decides whether a refused one may try again.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import TypeVar

from dataservice.client.handle import now_ms
from dataservice.client.publisher import Publisher
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import InternalError, InvalidArgument, RequestError, RetryableError
from dataservice.identifiers import CALLER_RE
from dataservice.refusals import Reason
from dataservice.security.callers import CallerKey, load_keyring
from dataservice.types import ReadMany, ReadManyOp, ReadOp, Record, Result

R = TypeVar("R")

# Refusals a call does not retry itself: the lane cannot serve it within its
# deadline now (a later attempt would have less time still), or this
# client's throttle says the service is refusing most of what it is sent.
# The caller hears at once, with the retry-after, and decides. (With the
# throttle off, the client retries them as it did before it had one.)
FINAL_REFUSALS = frozenset(
    {Reason.QUEUE_FULL, Reason.QUEUE_BYTES, Reason.QUEUE_TOO_LONG, Reason.THROTTLED}
)


def expect(result: Result, kind: type[R]) -> R:
    if not isinstance(result, kind):
        raise InternalError(f"the service answered with a {type(result).__name__}")
    return result


def signing_key(caller: str, settings: Settings, key: CallerKey | None) -> CallerKey:
    """``key``, or the caller's first key in the callers file, once checked."""
    if not CALLER_RE.fullmatch(caller):
        raise InvalidArgument(f"caller name is malformed (allowed: {CALLER_RE.pattern})")
    key = load_keyring(settings.callers_file).signing_key(caller) if key is None else key
    if key.caller != caller:
        raise InvalidArgument("the signing key belongs to another caller")
    return key


class BaseClient:
    """A caller of the data service: the part of a client that does no I/O."""

    caller: str
    config: Config
    _publisher: Publisher

    def _retry_in_ms(self, error: RetryableError, attempt: int, deadline_ms: int) -> float | None:
        """How long to wait before the next attempt after ``error`` ended
        attempt ``attempt``; None: raise it."""
        retry = self.config.client.retry
        throttle = self._publisher.throttle
        final = throttle.config.enabled and error.reason in FINAL_REFUSALS
        if final or attempt >= retry.max_attempts:
            return None
        if not throttle.may_retry(LaneName.INTERACTIVE, error.reason):
            return None
        cap_ms = min(retry.backoff_max_ms, retry.backoff_base_ms << (attempt - 1))
        delay_ms = error.retry_after * 1000 + random.uniform(0, cap_ms)
        if now_ms() + delay_ms >= deadline_ms:
            return None
        return delay_ms

    def _read_many_plan(
        self, scope: str, ids: Iterable[str | tuple[str, str]], mode: ReadMode
    ) -> ReadManyPlan:
        reads = [
            ReadOp(scope, one, mode) if isinstance(one, str) else ReadOp(one[0], one[1], mode)
            for one in ids
        ]
        most = self.config.lanes.interactive.max_ops_per_message
        return ReadManyPlan(reads, most, self.config.client.retry.max_attempts)


class ReadManyPlan:
    """``read_many``'s rounds: each sends the reads still to do, up to
    ``most`` per message (:meth:`messages`); their answers are taken in
    (:meth:`took`), and :meth:`next_round` says whether, and after how long,
    another round goes. A record the answer had no room for
    (``response_full``) is asked for again; a read answered retryably is
    retried as a single read's call retries, all within the one deadline."""

    def __init__(self, reads: list[ReadOp], most: int, max_attempts: int) -> None:
        self._reads = reads
        self._most = most
        self._max_attempts = max_attempts
        self._results: list[Record | RequestError | None] = [None] * len(reads)
        self._todo = list(range(len(reads)))
        self._again: list[int] = []
        self._wait_s = 0.0
        self._attempt = 1

    def messages(self) -> list[tuple[list[int], ReadManyOp]]:
        """This round's messages: the reads' places, and the operation."""
        chunks = [self._todo[at : at + self._most] for at in range(0, len(self._todo), self._most)]
        return [(chunk, ReadManyOp(tuple(self._reads[i] for i in chunk))) for chunk in chunks]

    def took(self, chunk: list[int], answer: ReadMany) -> None:
        for i, one in zip(chunk, answer.results, strict=True):
            self._results[i] = one
            if not isinstance(one, RetryableError):
                continue
            if one.reason == Reason.RESPONSE_FULL:
                self._again.append(i)
            elif self._attempt < self._max_attempts and one.reason not in FINAL_REFUSALS:
                self._again.append(i)
                self._wait_s = max(self._wait_s, one.retry_after)

    def next_round(self, deadline_ms: int) -> float | None:
        """Seconds to wait before the next round; None: the reads are done
        (or the wait would end past the deadline)."""
        self._todo, self._again, self._attempt = self._again, [], self._attempt + 1
        wait_s, self._wait_s = self._wait_s, 0.0
        if not self._todo or (wait_s and now_ms() + wait_s * 1000 >= deadline_ms):
            return None
        return wait_s

    def results(self) -> list[Record | RequestError]:
        return [one for one in self._results if one is not None]

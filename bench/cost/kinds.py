"""The request kinds the bench counts, each a call made with the public
:class:`~dataservice.client.Client` as a caller would make it.

A call asks for ``per_call`` requests: one for the single calls, the batch
size for ``submit_many`` (operations) and ``read_many`` (ids); what it cost is
reported per request. Each caller thread has one client for all kinds
(:class:`Clients`), as a service process would.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from dataservice_tools.testkit.callers import Call

from bench import _env
from dataservice import Record, ResourceExhausted, WriteOp, WriteResult
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode

PAYLOAD_BYTES = 1024
# The seeded records, read by the read kinds.
SCOPE = "cost"
# What the write kinds write: never the read kinds' records, which stay cached.
WRITE_SCOPE = "cost-writes"
PAYLOAD = os.urandom(PAYLOAD_BYTES)
# Refusals in a row after which a call fails (the lane is then not just busy).
MAX_REFUSALS = 20

Make = Callable[[Client, list[str], random.Random, int], Call]


@dataclass(frozen=True)
class Kind:
    name: str
    lane: LaneName
    # What one request is: a read, an operation of a batch, an id of read_many.
    unit: str
    batched: bool
    make: Make

    def per_call(self, batch: int) -> int:
        return batch if self.batched else 1


def _check_record(record: object) -> None:
    if not isinstance(record, Record) or len(record.payload) != PAYLOAD_BYTES:
        raise AssertionError(f"not a {PAYLOAD_BYTES} B record: {record!r}")


def _reader(mode: ReadMode) -> Make:
    def make(client: Client, ids: list[str], rng: random.Random, batch: int) -> Call:
        def call() -> None:
            _check_record(client.read(SCOPE, rng.choice(ids), mode=mode))

        return call

    return make


def _ids_of_thread() -> Callable[[], str]:
    """Ids no other call of the run writes: the thread's name and a count."""
    tag = threading.current_thread().name
    numbers = itertools.count()
    return lambda: f"{tag}-{next(numbers):07d}"


def _writer(client: Client, ids: list[str], rng: random.Random, batch: int) -> Call:
    fresh = _ids_of_thread()

    def call() -> None:
        answer = client.write(WRITE_SCOPE, fresh(), PAYLOAD)
        if not isinstance(answer, WriteResult):
            raise AssertionError(f"not a write's result: {answer!r}")

    return call


def _batch(client: Client, ids: list[str], rng: random.Random, batch: int) -> Call:
    fresh = _ids_of_thread()

    def call() -> None:
        handles = client.submit_many([WriteOp(WRITE_SCOPE, fresh(), PAYLOAD) for _ in range(batch)])
        for answer in client.results(handles):
            if not isinstance(answer, WriteResult):
                raise AssertionError(f"not a write's result: {answer!r}")

    return call


def _read_many(client: Client, ids: list[str], rng: random.Random, batch: int) -> Call:
    def call() -> None:
        for record in client.read_many(SCOPE, rng.sample(ids, batch)):
            _check_record(record)

    return call


KINDS = (
    Kind("cached read", LaneName.INTERACTIVE, "read", False, _reader(ReadMode.ALLOW_CACHED)),
    Kind("PRIMARY read", LaneName.INTERACTIVE, "read", False, _reader(ReadMode.PRIMARY)),
    Kind("read_many", LaneName.INTERACTIVE, "id", True, _read_many),
    Kind("write", LaneName.INTERACTIVE, "write", False, _writer),
    Kind("submit_many", LaneName.BATCH, "operation", True, _batch),
)
CACHED_READ = KINDS[0].name


class Clients:
    """One client per thread, made on the thread's first call and closed together."""

    def __init__(self, settings: Settings, config: Config) -> None:
        self._settings = settings
        self._config = config
        self._local = threading.local()
        self._lock = threading.Lock()
        self._made: list[Client] = []
        self.refused: Counter[str] = Counter()

    def mine(self) -> Client:
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = Client(_env.CALLER, self._settings, self._config)
            self._local.client = client
            with self._lock:
                self._made.append(client)
        return client

    def factories(self, ids: list[str], batch: int) -> dict[str, Callable[[random.Random], Call]]:
        """What :class:`~dataservice_tools.testkit.callers.Caller` makes its calls
        with: each call made again after its retry-after when admission refuses
        it, as a caller that must have its answer would (:attr:`refused` counts
        those refusals by kind; what they cost is in the kind's figures)."""

        def factory(kind: Kind) -> Callable[[random.Random], Call]:
            def make(rng: random.Random) -> Call:
                call = kind.make(self.mine(), ids, rng, batch)

                def patient() -> None:
                    for _ in range(MAX_REFUSALS):
                        try:
                            call()
                        except ResourceExhausted as exc:
                            with self._lock:
                                self.refused[kind.name] += 1
                            time.sleep(exc.retry_after)
                        else:
                            return
                    call()

                return patient

            return make

        return {kind.name: factory(kind) for kind in KINDS}

    def close(self) -> None:
        with self._lock:
            made, self._made = self._made, []
        for client in made:
            client.close()

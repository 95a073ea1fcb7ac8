"""What the change stream's fault tests use: random writes with planted and
filled entries (:class:`Writes`), a check of the cache against the database
(:func:`stale_entries`), consumer processes to kill (:class:`Consumers`), and
a MariaDB and a Redis of a test's own to stop and start again."""

from __future__ import annotations

import bisect
import contextlib
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import (
    PrivateMariaDB,
    free_port,
    redis_reachable,
    start_redis,
)
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, text

from dataservice.cache.formats import CODECS, frame, unframe
from dataservice.cache.store import CacheStore
from dataservice.config.model import Config
from dataservice.enums import CacheFormat
from dataservice.ops.processes import WorkerProcess, stop_all
from dataservice.proto import pb
from dataservice.redis.keys import record_key
from dataservice.store.migrate import upgrade
from tests.conftest import require, started_binlog_mariadb
from tests.harness.changes import consumer_process, holder

WRITERS, IDS, WRITES = 4, 200, 2_000
# Paces the writers so that the writes outlast the kills: a killed active
# consumer's successor first waits for its lease to lapse.
PACE_S = 0.12
INSERT = text(
    "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
    " VALUES (:s, :o, :r, 'x', NOW(6), NOW(6))"
)
UPDATE = text("UPDATE records SET revision = :r WHERE scope = :s AND object_id = :o")
DELETE = text("DELETE FROM records WHERE scope = :s AND object_id = :o")


class Writes:
    """Random row changes by ``WRITERS`` threads, each the only writer of its
    ids, so it knows their revisions (kept rising across deletes) without
    reading them back. Odd ids get entries planted (without overwriting) just
    before each change: one a missed change would leave behind. Even ids get
    fills, as real ones, from a filler thread. The ids go in groups that stop
    changing one after another, at the change counts in ``retire_at``; half
    the changes go to the next group to retire, so each id's last change (the
    one the end state shows) comes shortly before its group's retirement."""

    def __init__(
        self, engine: Engine, client: redis.Redis, scope: str, generation: int, retire_at: list[int]
    ) -> None:
        self.engine, self.client, self.scope, self.generation = engine, client, scope, generation
        self.retire_at, self.groups = sorted(retire_at), len(retire_at) + 1
        self.ids = [f"o{n}" for n in range(IDS)]
        self.revision = dict.fromkeys(self.ids, 1)
        self.present = dict.fromkeys(self.ids, True)
        self.done = 0
        self.fills: Counter[str] = Counter()
        self.stop = threading.Event()
        self._count = threading.Lock()

    def write(self, writer: int, seed: int) -> None:
        rng = random.Random(seed)
        own = range(writer, IDS, WRITERS)
        while self.done < WRITES:
            retired = bisect.bisect_right(self.retire_at, self.done)
            live = [n for n in own if n * self.groups // IDS >= retired] or [own[-1]]
            going = [n for n in live if n * self.groups // IDS == retired]
            pool = going if going and rng.random() < 0.5 else live
            batch = [self.ids[n] for n in rng.sample(pool, min(len(pool), rng.choice((1, 2, 3))))]
            statements = []
            for o in batch:
                if int(o[1:]) % 2 and self.present[o]:
                    self._plant(o, self.revision[o])
                deleting = self.present[o] and rng.random() < 0.25
                # A delete leaves the revision it removed; the next insert goes on from it.
                self.revision[o] += 0 if deleting else 1
                statements.append(DELETE if deleting else UPDATE if self.present[o] else INSERT)
            with self.engine.begin() as conn:
                for o, statement in zip(batch, statements, strict=True):
                    conn.execute(statement, {"s": self.scope, "o": o, "r": self.revision[o]})
            for o, statement in zip(batch, statements, strict=True):
                self.present[o] = statement is not DELETE
            with self._count:
                self.done += len(batch)
            time.sleep(rng.uniform(0, 2 * PACE_S))

    def expected(self) -> dict[str, int]:
        """Each present record's revision, as the database should hold them."""
        return {o: r for o, r in self.revision.items() if self.present[o]}

    def floors(self) -> dict[str, int]:
        """The tombstone each record's last change leaves."""
        return {o: r if self.present[o] else r + 1 for o, r in self.revision.items()}

    def _plant(self, object_id: str, revision: int) -> None:
        record = pb.Record(object_id=object_id, revision=revision)
        for fmt in CacheFormat:
            key = record_key(fmt.value, self.scope, object_id, self.generation)
            self.client.set(key, frame(revision, CODECS[fmt].encode(record)), nx=True)

    def fill(self, seed: int, ttl_ms: int) -> None:
        """Lock-free fills (as with coalescing off): Redis's clock before the
        read, so that the tombstone and expiry rules apply as to real ones."""
        rng, store = random.Random(seed), CacheStore(self.client)
        select = text("SELECT revision FROM records WHERE scope = :s AND object_id = :o")
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            while not self.stop.wait(0.005):
                o = self.ids[rng.randrange(0, IDS, 2)]
                seconds, micros = self.client.time()
                revision = conn.execute(select, {"s": self.scope, "o": o}).scalar()
                # A slow leader's fill, so that changes overtake some of them.
                if revision is None or self.stop.wait(rng.uniform(0, 0.05)):
                    continue
                record = pb.Record(object_id=o, revision=revision, payload=b"x")
                started_ms = seconds * 1000 + micros // 1000
                done = store.fill(
                    record, CacheFormat, self.scope, self.generation, started_ms, ttl_ms
                )
                self.fills[done.outcome] += 1


def stale_entries(client: redis.Redis, scope: str, revisions: dict[str, int]) -> list[str]:
    """Every entry, in either format and any generation, whose revision is
    not its record's (or whose record is gone)."""
    stale = []
    for key in client.scan_iter(match=f"record:v[12]:{scope}:*", count=1000):
        object_id = key.decode().split(":", 3)[3].rpartition("#")[0]
        framed = unframe(client.get(key) or b"")
        if framed is None or framed[0] != revisions.get(object_id):
            stale.append(
                f"{key.decode()} at {framed and framed[0]}, database {revisions.get(object_id)}"
            )
    return stale


class Consumers:
    """``dataservice changes`` processes; a killed one is started again at
    once, each run with a log of its own, so the log that announced the
    lease's token names the process holding it."""

    def __init__(self, binlog_url: str, config_path: Path, directory: Path, count: int) -> None:
        self._url, self._config_path, self._directory = binlog_url, config_path, directory
        self._runs = 0
        self.processes = [self._start(slot) for slot in range(count)]

    def _start(self, slot: int) -> WorkerProcess:
        self._runs += 1
        log = self._directory / f"consumer-{slot}-{self._runs}.log"
        return consumer_process(self._url, log, self._config_path).start()

    def active(self, client: redis.Redis) -> int | None:
        """The slot of the process holding the lease, if it is alive."""
        mark = f"(token {holder(client)})"
        for slot, process in enumerate(self.processes):
            if process.running and mark in process.log_path.read_text(errors="replace"):
                return slot
        return None

    def kill(self, slot: int) -> None:
        for process in self.processes:
            process.check_alive()  # none exits on its own, whatever it met
        self.processes[slot].send_signal(signal.SIGKILL)
        self.processes[slot].wait(5)
        self.processes[slot] = self._start(slot)

    def stop(self) -> None:
        stop_all(self.processes)


@pytest.fixture
def restartable_mariadb(config: Config) -> Iterator[PrivateMariaDB]:
    """A private binlog MariaDB; ``PrivateMariaDB.stop`` stops it keeping its
    data (its own ``stop`` deletes it, at the end)."""
    server = started_binlog_mariadb()
    try:
        upgrade(server.url("dataservice"), config.database)
        yield server
    finally:
        server.stop()


class OwnRedis:
    """A redis-server of the test's own (nothing saved), to kill and start again empty."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        start_redis(self.directory, self.port)

    def kill(self) -> None:
        pid = int((self.directory / "redis" / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        # Unreachable once its sockets are closed, reaped or not.
        eventually(lambda: not redis_reachable(self.url), timeout=5.0)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    require(shutil.which("redis-server") is not None, "redis-server")
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.kill()

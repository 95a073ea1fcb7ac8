"""Acceptance: ``Client.read_many`` answers each id on its own, in one call.

One interactive replica, its records in a database of the test's own whose
general log counts the statements, its cache on Redis db 9 watched with
``MONITOR``. 100 ids: 60 cached, 37 not (5 of them missing), 3 in a scope
the caller may not read. The hits come in one round trip (one ``MGET``), the
misses in one ``SELECT ... IN`` per permit, and the refused ids are refused
before any lookup: neither Redis nor the database hears of them.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.testkit.counting_database import CountingDatabase
from dataservice_tools.testkit.replicas import Replicas, replicas, until_each_answers

from dataservice import Client, NotFound, PermissionDenied, Record
from dataservice.broker.library import PUBLISH
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import ReadMode
from dataservice.errors import InvalidArgument
from tests.harness.support import with_retry

CALLER = "tests-narrow"  # may read narrow-* only
CACHED, UNCACHED, MISSING, DENIED = 60, 32, 5, 3
PAYLOAD = b"one of many " * 20
_IN_LIST = "(scope, object_id) IN"


class Monitor:
    """Every command a Redis server runs while it is open (``MONITOR``), as the
    raw lines the server sends; read on a thread of its own."""

    def __init__(self, url: str) -> None:
        parsed = redis.connection.parse_url(url)
        self._socket = socket.create_connection(
            (parsed.get("host", "127.0.0.1"), parsed.get("port", 6379)), timeout=0.2
        )
        self._socket.sendall(b"MONITOR\r\n")
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        while not self._stop.is_set():
            try:
                chunk = self._socket.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            buffer += chunk
            *complete, buffer = buffer.split(b"\r\n")
            self.lines += [line.decode(errors="replace") for line in complete]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()

    def commands(self, containing: str) -> list[str]:
        """The commands (name first) a client sent whose line mentions
        ``containing`` (not those a script ran: ``[<db> lua]``)."""
        found = []
        for line in self.lines:
            source, _, command = line.partition("] ")
            if containing in command and not source.endswith(" lua"):
                found.append(command)
        return found


@pytest.fixture
def replica(
    replica_settings: Settings, config: Config, tmp_path: Path
) -> Iterator[tuple[Settings, Replicas]]:
    with replicas(replica_settings, config, tmp_path, 1) as started:
        yield replica_settings, started


def _ids(scope: str, denied_scope: str) -> list[tuple[str, str]]:
    ids = [(scope, f"c{n:03d}") for n in range(CACHED)]
    ids += [(scope, f"u{n:03d}") for n in range(UNCACHED)]
    ids += [(scope, f"m{n:03d}") for n in range(MISSING)]
    ids += [(denied_scope, f"d{n:03d}") for n in range(DENIED)]
    return ids


@pytest.mark.timeout(180)
def test_one_round_trip_for_the_hits_one_select_for_the_misses_and_refusals_before_any_lookup(
    replica: tuple[Settings, Replicas], config: Config, counting_database: CountingDatabase
) -> None:
    settings, started = replica
    one_attempt = with_retry(config, max_attempts=1)
    scope = f"narrow-{uuid.uuid4().hex[:10]}"
    denied = f"other-{uuid.uuid4().hex[:10]}"
    ids = _ids(scope, denied)
    existing = [object_id for s, object_id in ids if not object_id.startswith("m") and s == scope]
    counting_database.seed(scope, [*existing, "warm"], PAYLOAD)
    counting_database.seed(denied, [object_id for _, object_id in ids[-DENIED:]], PAYLOAD)
    until_each_answers(settings, one_attempt, started.workers, "tests", scope, "warm", 90)
    with Client(CALLER, settings, one_attempt) as client:
        for _, object_id in ids[:CACHED]:
            client.read(scope, object_id)  # a miss that fills the cache
        monitor = Monitor(settings.redis_url)
        counting_database.forget()
        try:
            answers = client.read_many(scope, [i if s == scope else (s, i) for s, i in ids])
        finally:
            monitor.close()

    assert len(answers) == len(ids)
    for (s, object_id), answer in zip(ids, answers, strict=True):
        if s == denied:
            assert isinstance(answer, PermissionDenied), (object_id, answer)
            assert answer.reason == "scope_denied"
        elif object_id.startswith("m"):
            assert isinstance(answer, NotFound), (object_id, answer)
        else:
            assert isinstance(answer, Record), (object_id, answer)
            assert (answer.object_id, answer.payload, answer.revision) == (object_id, PAYLOAD, 1)

    # The hits: one MGET of every allowed id, and no other look at an entry.
    reads = [c for c in monitor.commands(f"record:v2:{scope}:") if c.startswith('"MGET"')]
    assert len(reads) == 1, reads
    assert reads[0].count(f"record:v2:{scope}:") == CACHED + UNCACHED + MISSING
    assert not [c for c in monitor.commands(f"record:v2:{scope}:") if c.startswith('"GET"')]
    # The refused ids were looked up nowhere (the request, published with
    # its bytes, and the answer, on the client's reply channel, name their scope).
    looked = [c for c in monitor.commands(denied) if "ds:reply:" not in c]
    assert [c for c in looked if not c.startswith(f'"FCALL" "{PUBLISH}"')] == []
    assert counting_database.statements(denied) == []
    # The misses: one SELECT ... IN (the lane's keys per SELECT hold them all).
    selects = counting_database.statements(_IN_LIST)
    assert len(selects) == 1, selects
    assert selects[0].count(scope) == UNCACHED + MISSING
    assert counting_database.reads(scope) == 0  # no single-record read


@pytest.mark.timeout(180)
def test_more_ids_than_a_message_holds_and_answers_too_big_for_one_come_back_whole(
    replica: tuple[Settings, Replicas], config: Config, counting_database: CountingDatabase
) -> None:
    """250 ids of 20 KB records: the client sends them in messages of at most
    ``max_ops_per_message`` reads; an answer holds about 50 of them within
    ``limits.max_response_bytes``, and the client asks again for the rest
    (``response_full``) until every one has come, in the order asked."""
    settings, started = replica
    scope = f"t-{uuid.uuid4().hex[:10]}"
    big = bytes(range(256)) * 80
    object_ids = [f"big{n:03d}" for n in range(250)]
    counting_database.seed(scope, object_ids, big)
    until_each_answers(settings, config, started.workers, "tests", scope, object_ids[0], 90)
    counting_database.forget()
    with Client("tests", settings, config) as client:
        answers = client.read_many(scope, object_ids, mode=ReadMode.PRIMARY, timeout=30)
    assert [a.object_id for a in answers if isinstance(a, Record)] == object_ids
    assert all(isinstance(a, Record) and a.payload == big for a in answers)
    # More messages than 250 / 100: some answers were full.
    assert len(counting_database.statements(_IN_LIST)) > 3


def test_a_malformed_id_is_refused_before_anything_is_sent(settings: Settings) -> None:
    config = settings.load()
    with Client("tests", settings, config) as client, pytest.raises(InvalidArgument):
        client.read_many("s", ["fine", "not fine!"])

"""Commit-to-invalidation latency of the change stream, against the binlog's own delivery.

    .venv/bin/python bench/changes_latency.py [--writes 1000] [--ids 200] [--json out.json]

Sets everything up itself: a private MariaDB with a binlog (a temporary
directory and a free port), migrated; Redis db ``--redis-db`` (flushed before
and after; never db 0); one ``dataservice changes`` subprocess, waited for
until it reports as the active consumer. Then ``--writes`` random changes by direct SQL, one
at a time (inserts, updates and deletes of ``--ids`` records in one scope),
each made after the record's cache entries were planted in both formats:

- **invalidation latency**: from the moment the write's ``COMMIT`` returned to
  the moment neither entry exists any more (polled every 0.2 ms);
- **baseline, the binlog's own delivery**: from the same moment to the
  arrival of the write's row event at a bare ``mysql-replication`` reader in
  this process (the floor any binlog consumer stands on). It decodes only a
  transaction's last row event, once the commit is read.

The report gives both distributions and the ratio of their p50s and p99s.
**Target: invalidation p99 at most 200 ms.**

``--cells N`` runs the consumer for N cells (``dataservice.config.cells``):
the first on ``--redis-db``, each other on a private ``redis-server`` of its
own. Each write's entries are planted in every cell, and its invalidation
latency is the time until they are gone from all of them.
**Target (``--cells 3``): p99 at most 5 ms.**

``--group N`` measures big transactions instead: ``--transactions`` group
commits of N writes each, made by the store's own group commit
(``RecordStore.apply_group``, as a batch's worker runs them: one
transaction, N rows, N idempotency outcomes), each after every record's
entries were planted in both formats. Per transaction, the time from the
``COMMIT`` to the moment all 2 x N entries are gone (polled every 0.2 ms);
the binlog's own delivery is the arrival of the transaction's last row event.
**Target (``--group 500``): p99 at most 50 ms.**
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import yaml
from dataservice_tools.loadtest.changes import start_consumer
from dataservice_tools.localservices import PrivateRedis, TemporaryBinlogMariaDB
from dataservice_tools.testkit.machine import machine_info
from dataservice_tools.testkit.series import percentile
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
from sqlalchemy import create_engine, text

from bench import _env
from dataservice.cache.controls import RolloutControls
from dataservice.cache.formats import CODECS, frame
from dataservice.changes.stream import connection_settings
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import CacheFormat
from dataservice.ops.processes import WorkerProcess
from dataservice.proto import pb
from dataservice.redis.keys import record_key
from dataservice.store import Idempotency, Mutation, RecordStore, create_store_engine
from dataservice.store.migrate import upgrade

TARGET_P99_MS = 200.0
TARGET_GROUP_P99_MS = 50.0
TARGET_CELLS_P99_MS = 5.0
_POLL_S = 0.0002


def _at(values: list[float], q: float) -> float:
    found = percentile(values, q)
    if found is None:
        raise ValueError("no samples: nothing was measured")
    return found


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": _at(values, 50),
        "p90_ms": _at(values, 90),
        "p99_ms": _at(values, 99),
        "max_ms": max(values),
        "mean_ms": statistics.fmean(values),
    }


class Arrivals:
    """A bare binlog reader: when each (scope, id, revision) arrived."""

    def __init__(self, url: str, schema: str) -> None:
        settings, _ = connection_settings(url)
        self._reader = BinLogStreamReader(
            connection_settings=settings,
            server_id=4299,
            blocking=True,
            resume_stream=False,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent],
            only_schemas=[schema],
            only_tables=["records"],
            enable_logging=False,
        )
        self.seen: dict[tuple[str, int], float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Only a transaction's last row event is decoded, once its commit is
        # read: decoding every row (the library's 90 µs each) would take the
        # CPU the consumer under test needs, and is not the binlog's delivery.
        last: Any = None
        arrived = 0.0
        try:
            for event in self._reader:
                now = time.monotonic()
                if not isinstance(event, XidEvent):
                    last, arrived = event, now
                    continue
                for row in last.rows if last is not None else ():
                    values = row.get("after_values") or row.get("values")
                    self.seen[(values["object_id"], values["revision"])] = arrived
                last = None
        except Exception:
            return


def measure(
    args: argparse.Namespace,
    rng: random.Random,
    url: str,
    cells: list[tuple[redis.Redis, int]],
    arrivals: Arrivals,
) -> tuple[list[float], list[float], dict[str, int]]:
    """One write at a time: plant both formats in every cell (each its client
    and its cache's generation), write, time the invalidation in all of them
    and the binlog's own delivery of the same row."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    scope = f"bench-{uuid.uuid4().hex[:8]}"
    revisions: dict[str, int] = {}
    invalidation: list[float] = []
    delivery: list[float] = []
    kinds = {"insert": 0, "update": 0, "delete": 0}
    body = CODECS[CacheFormat.V2].encode(pb.Record(object_id="x", revision=1))
    with engine.connect() as conn:
        for _ in range(args.writes):
            object_id = f"id-{rng.randrange(args.ids)}"
            current = revisions.get(object_id)
            planted = [
                (client, [record_key(f.value, scope, object_id, gen) for f in CacheFormat])
                for client, gen in cells
            ]
            for client, keys in planted:
                for key in keys:
                    client.set(key, frame(current or 0, body))
            if current is not None and rng.random() < 0.2:
                kind, revision = "delete", current
                conn.execute(
                    text("DELETE FROM records WHERE scope = :s AND object_id = :o"),
                    {"s": scope, "o": object_id},
                )
                del revisions[object_id]
            else:
                kind, revision = ("update" if current else "insert"), (current or 0) + 1
                conn.execute(
                    text(
                        "INSERT INTO records (scope, object_id, revision, payload,"
                        " created_at, updated_at) VALUES (:s, :o, :r, 'p', NOW(6), NOW(6))"
                        " ON DUPLICATE KEY UPDATE revision = :r, updated_at = NOW(6)"
                    ),
                    {"s": scope, "o": object_id, "r": revision},
                )
                revisions[object_id] = revision
            committed = time.monotonic()
            kinds[kind] += 1
            while any(client.exists(*keys) for client, keys in planted):
                if time.monotonic() - committed > 10:
                    raise RuntimeError(f"{object_id} was not invalidated within 10 s")
                time.sleep(_POLL_S)
            invalidation.append((time.monotonic() - committed) * 1000)
            arrived_at = None
            while arrived_at is None and time.monotonic() - committed < 10:
                arrived_at = arrivals.seen.get((object_id, revision))
                time.sleep(_POLL_S)
            if arrived_at is not None:
                delivery.append(max(0.0, arrived_at - committed) * 1000)
    engine.dispose()
    return invalidation, delivery, kinds


def measure_groups(
    args: argparse.Namespace,
    url: str,
    client: redis.Redis,
    generation: int,
    arrivals: Arrivals,
    shipped: Config,
) -> tuple[list[float], list[float], dict[str, int]]:
    """Group commits of ``--group`` writes: plant every record's entries in
    both formats, commit the group, time until all of them are gone."""
    engine = create_store_engine(url, 1, shipped.database)
    store = RecordStore(engine, max_statement_ms=shipped.database.max_statement_ms)
    scope = f"bench-{uuid.uuid4().hex[:8]}"
    body = CODECS[CacheFormat.V2].encode(pb.Record(object_id="x", revision=1))
    invalidation: list[float] = []
    delivery: list[float] = []
    for t in range(args.transactions):
        # The same records every time, in key order (the group's own, and the
        # binlog's): the last row event is the last id's.
        ids = [f"id-{n:05d}" for n in range(args.group)]
        keys = [record_key(f.value, scope, i, generation) for i in ids for f in CacheFormat]
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.set(key, frame(0, body))
            pipe.execute()
        payload = b"p" * args.payload_bytes
        mutations = [
            Mutation(scope, i, payload, 0, Idempotency("bench", f"{scope}-{t}-{i}", bytes(32)))
            for i in ids
        ]
        outcomes = store.apply_group(mutations)
        committed = time.monotonic()
        # The consumer deletes a transaction's entries in one script: polled
        # by one key, all of them checked once it is gone (asking for all
        # 1,000 every 0.2 ms would take the CPU the consumer needs).
        while client.exists(keys[-1]) or client.exists(*keys):
            if time.monotonic() - committed > 10:
                raise RuntimeError(f"transaction {t} was not invalidated within 10 s")
            time.sleep(_POLL_S)
        invalidation.append((time.monotonic() - committed) * 1000)
        final = outcomes[-1]
        if final is None or final.revision is None:
            raise RuntimeError(f"transaction {t}: the group did not write {ids[-1]}")
        arrived_at = None
        while arrived_at is None and time.monotonic() - committed < 10:
            arrived_at = arrivals.seen.get((ids[-1], final.revision))
            time.sleep(_POLL_S)
        if arrived_at is not None:
            delivery.append(max(0.0, arrived_at - committed) * 1000)
    engine.dispose()
    return invalidation, delivery, {"transactions": args.transactions, "rows": args.group}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    server = TemporaryBinlogMariaDB().start()
    redis_url = _env.redis_url("127.0.0.1", 6379, args.redis_db)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    workdir = Path(server.datadir).parent
    consumer: WorkerProcess | None = None
    others = [PrivateRedis(workdir / f"cell-{n}") for n in range(1, args.cells)]
    clients: list[redis.Redis] = []

    try:
        url = server.url("dataservice")
        shipped = load_config(_env.REPO / "queues.yml")
        upgrade(url, shipped.database)
        config_path = workdir / "queues.yml"
        document = yaml.safe_load((_env.REPO / "queues.yml").read_text(encoding="utf-8"))
        cells_file = None
        for other in others:
            other.start()
        clients = [redis.Redis.from_url(other.url) for other in others]
        if others:
            names = [f"c{n}" for n in range(args.cells)]
            document["cells"] = {"names": names, "callers": {}}
            urls = [redis_url, *(other.url for other in others)]
            cells_file = workdir / "cells.yml"
            entries = {n: {"redis_url": u} for n, u in zip(names, urls, strict=True)}
            cells_file.write_text(yaml.safe_dump({"cells": entries}))
        config_path.write_text(yaml.safe_dump(document, sort_keys=False))
        settings = Settings(
            config_path=config_path,
            broker_url=redis_url,
            result_backend_url=redis_url,
            database_url=url,
            redis_url=redis_url,
            cells_file=cells_file,
        )
        consumer = start_consumer(settings, workdir / "changes.log")
        # Its first act is a rotation in every cell (no saved position, no
        # freshness word): wait for them to settle.
        time.sleep(1.0 + shipped.cache.controls_max_age_ms / 1000)
        cells = [
            (c, RolloutControls(c, shipped.cache).fetch().generation) for c in [client, *clients]
        ]
        generation = cells[0][1]
        machine = machine_info(redis_url, url)
        arrivals = Arrivals(url, "dataservice")
        if args.group:
            invalidation, delivery, kinds = measure_groups(
                args, url, client, generation, arrivals, shipped
            )
        else:
            invalidation, delivery, kinds = measure(args, rng, url, cells, arrivals)
    finally:
        # The bare reader's thread blocks in a read that closing its
        # connection from here can deadlock on; the server's stop ends it.
        if consumer is not None:
            consumer.stop()
        client.flushdb()
        client.close()
        for other_client in clients:
            other_client.close()
        for other in others:
            other.signal(9)
        server.stop()
    inv, base = summary(invalidation), summary(delivery)
    target = TARGET_GROUP_P99_MS if args.group else TARGET_P99_MS
    if args.cells > 1:
        target = TARGET_CELLS_P99_MS
    return {
        "command": " ".join(["python", "bench/changes_latency.py", *sys.argv[1:]]),
        "machine": machine,
        "setup": {
            "writes": args.writes,
            "ids": args.ids,
            "kinds": kinds,
            "seed": args.seed,
            "group": args.group,
            "cells": args.cells,
        },
        "invalidation": inv,
        "binlog_delivery": base,
        # Each write's or transaction's, in order (ms): the tail's neighbours.
        "samples": {"invalidation": invalidation, "binlog_delivery": delivery},
        # None where the binlog's own delivery rounds to nothing.
        "ratios": {
            q: inv[f"{q}_ms"] / base[f"{q}_ms"] if base[f"{q}_ms"] else None for q in ("p50", "p99")
        },
        "target": {"p99_ms": target, "met": inv["p99_ms"] <= target},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--writes", type=int, default=1000)
    p.add_argument("--ids", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--redis-db", type=int, default=2, help="flushed before and after; not 0")
    p.add_argument("--group", type=int, default=0, help="writes per group commit (0: single)")
    p.add_argument("--transactions", type=int, default=100, help="group commits (with --group)")
    p.add_argument("--payload-bytes", type=int, default=1024, help="each record's (with --group)")
    p.add_argument("--cells", type=int, default=1, help="cells to invalidate in (not with --group)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.redis_db == 0:
        p.error("--redis-db must not be 0")
    if args.cells < 1 or (args.cells > 1 and args.group):
        p.error("--cells must be at least 1, and 1 with --group")
    report = run(args)
    shown = ("setup", "invalidation", "binlog_delivery", "ratios", "target")
    print(yaml.safe_dump({k: report[k] for k in shown}, sort_keys=False))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["target"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())

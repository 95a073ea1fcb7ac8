"""The attribution bench's two composed workers, (a) and (b); (c) is the
service's own ``dataservice worker --lane interactive``.

**(a) plain**: a stock Celery app (JSON task and result serializer, Redis
broker and result backend, awaited with ``.get()``) whose task reads the
record through the service's :class:`~dataservice.store.RecordStore` (the
same statement on the same engine settings) with no bounds: no admission, no
permit, no statement timeout. A cached read first GETs a plain JSON entry
(:func:`~bench.attribution.wire.plain_value`), and fills it on a miss.

**(b) admitted JSON**: the service's components with JSON instead of
protobuf. Requests are pushed through the broker channel's admission script
(``admit.lua``); reads go through the service's ``CachedSource`` with the v1
(JSON) cache format (so misses coalesce and fill as in the service), database
reads under a point-read permit through ``Database.run``; answers go to the
service's result lists, giving the request's admission bytes back in the same
script (``answer.lua``). A cache hit is answered on the consumer thread, as the
service answers one (``dataservice/worker/fastpath.py``), acknowledging the message in the
answer's script; anything else goes on to the pool. What (b) leaves out of the
service: request signatures, the gate's per-caller limits, and ``hit.lua``
(which splices a v2 entry into a protobuf answer and cannot carry JSON).

Both run with the service lane's worker options (threads pool, the lane's
concurrency, prefetch 1, late acknowledgement, fair scheduling, no gossip or
mingle). Run as ``python -m bench.attribution.app plain|json ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench.attribution.wire import (
    JSON_TASK,
    OK,
    PLAIN_TASK,
    json_response,
    plain_value,
)
from dataservice.broker.celery import celery_app
from dataservice.broker.results import Completion, ResultStore
from dataservice.cache.runtime import CacheRuntime
from dataservice.compat.celery import PER_TASK_LOGGERS
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.handler import Database
from dataservice.limits.admission import SIZE_HEADER, held_member
from dataservice.limits.permits import LanePermits
from dataservice.observe.metrics import CACHE_READS
from dataservice.ops.processes import node_name
from dataservice.proto import pb
from dataservice.redis.keys import admission_key, held_key
from dataservice.refusals import Refusal
from dataservice.store import RecordStore, create_store_engine
from dataservice.worker.answers import int_header
from dataservice.worker.fastpath import InlineMessage, Outcome, serve_inline

log = logging.getLogger(__name__)

PLAIN_QUEUE = "attribution"
# Celery's per-task lines would drown the logs at these rates (as dataservice/worker/start.py).


def _worker(app: Celery, kind: str, queue: str, concurrency: int) -> None:
    logging.basicConfig(level="WARNING", stream=sys.stderr)
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    app.Worker(
        hostname=node_name(kind),
        queues=[queue],
        pool="threads",
        concurrency=concurrency,
        prefetch_multiplier=1,
        optimization="fair",
        loglevel="WARNING",
        without_gossip=True,
        without_mingle=True,
        quiet=True,
    ).start()


# (a) ------------------------------------------------------------------------------


class _Plain:
    """The plain worker process's store and cache client (set before it starts)."""

    store: RecordStore | None = None
    cache: redis.Redis | None = None
    ttl_s = 300


def plain_read(scope: str, object_id: str, cached: bool) -> dict[str, Any] | None:
    """The task: the record as a JSON object, through a plain cache when ``cached``."""
    store, cache = _Plain.store, _Plain.cache
    if store is None or cache is None:
        raise RuntimeError("the plain worker was not set up")
    key = f"plain:{scope}:{object_id}"
    if cached:
        entry = cache.get(key)
        if isinstance(entry, bytes):
            value: dict[str, Any] = json.loads(entry)
            return value
    record = store.read(scope, object_id)
    if record is None:
        return None
    value = plain_value(record)
    if cached:
        cache.set(key, json.dumps(value), ex=_Plain.ttl_s)
    return value


def make_plain_app(url: str) -> Celery:
    """A stock Celery app on ``url`` (broker and result backend) with the read task."""
    app = Celery("attribution-plain", set_as_current=False)
    app.conf.update(
        broker_url=url,
        result_backend=url,
        broker_connection_retry_on_startup=True,
        task_default_queue=PLAIN_QUEUE,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        # Results are read once; a day's worth of 64 KB results would only fill Redis.
        result_expires=60,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    app.task(name=PLAIN_TASK)(plain_read)
    return app


def run_plain(url: str, database_url: str, config: Config) -> None:
    threads = config.lanes.interactive.concurrency
    _Plain.store = RecordStore(
        create_store_engine(database_url, threads, config.database),
        max_statement_ms=config.database.max_statement_ms,
    )
    _Plain.cache = redis.Redis.from_url(url, max_connections=threads + 2)
    _Plain.ttl_s = config.cache.ttl_s
    _worker(make_plain_app(url), "attribution-plain", PLAIN_QUEUE, threads)


# (b) ------------------------------------------------------------------------------


class JsonLane:
    """The service's components behind one lane, answering JSON requests."""

    def __init__(self, settings: Settings, config: Config) -> None:
        lane = config.lanes.interactive
        threads = lane.concurrency
        store = RecordStore(
            create_store_engine(settings.database_url, threads, config.database),
            max_statement_ms=config.database.max_statement_ms,
        )
        database = Database(LanePermits(lane), lane.permit_wait_ms)
        self.cache = CacheRuntime(
            settings, config, LaneName.INTERACTIVE.value, database, store, threads
        )
        self.results = ResultStore.from_url(
            settings.result_backend_url, max_waiters=threads + 2, bounded=True
        )
        self.queue = lane.queue
        self._admission = admission_key(lane.queue)
        self._held = held_key(lane.queue)
        self._grace_ms = config.results.grace_ms

    def answer(
        self,
        task_id: str,
        request: dict[str, Any],
        record: pb.Record | None,
        status: str,
        admitted_size: Any,
        ack: tuple[str, str, str] | None = None,
    ) -> None:
        """Leave the answer, giving the request's admission bytes back (and with
        ``ack`` acknowledging its message) in the same script."""
        size = int_header(admitted_size) or 0
        done = Completion(
            self._admission, (self._held, held_member(task_id, size)), size, None, ack
        )
        body = json_response(task_id, record, status)
        until_ms = int(request["deadline_ms"]) + self._grace_ms
        self.results.put(str(request["caller"]), task_id, body, until_ms, done)

    def serve(self, task_id: str, request: dict[str, Any], admitted_size: Any) -> None:
        """The pool's side: the read through the cache or the database, then the answer."""
        record = None
        try:
            record = self.cache.source.read(
                request["scope"],
                request["object_id"],
                _mode(request),
                int(request["deadline_ms"]),
                task_id,
            )
            status = OK if record is not None else "not_found"
        except Refusal as exc:
            status = str(exc.reason or type(exc).__name__)
        except Exception:
            # A bug: answer it rather than leave the caller waiting for its deadline.
            log.exception("json read %s failed", task_id)
            status = "internal"
        self.answer(task_id, request, record, status, admitted_size)


def _mode(request: dict[str, Any]) -> ReadMode:
    return ReadMode.ALLOW_CACHED if request.get("mode") == "allow_cached" else ReadMode.PRIMARY


class JsonInline:
    """Cache hits answered on the consumer thread; everything else goes to the pool."""

    def __init__(self, lane: JsonLane) -> None:
        self._lane = lane

    def __call__(self, message: InlineMessage) -> Outcome:
        request = message.args[0] if len(message.args) == 1 else None
        if not isinstance(request, dict) or _mode(request) is not ReadMode.ALLOW_CACHED:
            return Outcome.DECLINED
        cache, task_id = self._lane.cache, message.task_id
        # The rollout's format for this request, as the service's own peek
        # chooses it (the freshness guard is off in the bench's configuration).
        rollout = cache.controls.current()
        fmt = rollout.read_format(task_id)
        if fmt is None:
            return Outcome.DECLINED
        try:
            record = cache.store.get(
                fmt, request["scope"], request["object_id"], rollout.generation
            )
        except redis.RedisError:
            return Outcome.DECLINED
        if record is None:
            return Outcome.DECLINED
        CACHE_READS.labels(LaneName.INTERACTIVE.value, fmt.value, "hit").inc()
        ack = message.acknowledgement
        self._lane.answer(task_id, request, record, OK, message.admitted_size, ack)
        return Outcome.ANSWERED_AND_ACKED


class _Served:
    """The JSON worker process's lane (set before it starts)."""

    lane: JsonLane | None = None


def json_read(task: Any, *args: Any, **kwargs: Any) -> None:
    """The task: any arguments, so that a message of the wrong shape is still answered."""
    lane = _Served.lane
    if lane is None:
        raise RuntimeError("the JSON worker was not set up")
    request = args[0] if len(args) == 1 and isinstance(args[0], dict) else {}
    lane.serve(task.request.id, request, getattr(task.request, SIZE_HEADER, None))


def run_json(settings: Settings) -> None:
    config = settings.load()
    lane = _Served.lane = JsonLane(settings, config)
    app = celery_app("attribution-json", settings, config)
    task = app.task(name=JSON_TASK, bind=True, typing=False, ignore_result=True, shared=False)(
        json_read
    )
    serve_inline(task, JsonInline(lane))
    _worker(app, "attribution-json", lane.queue, config.lanes.interactive.concurrency)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.attribution.app", description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    plain = sub.add_parser("plain", help="(a): stock Celery, JSON, no admission or permits")
    plain.add_argument("--url", required=True, help="Redis URL: broker, results and cache")
    plain.add_argument("--database-url", required=True)
    plain.add_argument("--config", type=Path, required=True, help="queues.yml (database options)")
    sub.add_parser("json", help="(b): the service's components with JSON (DATASERVICE_* settings)")
    args = parser.parse_args(argv)
    if args.kind == "plain":
        run_plain(args.url, args.database_url, load_config(args.config))
    else:
        run_json(Settings.from_env())


if __name__ == "__main__":
    main()

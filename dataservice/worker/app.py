"""The worker's Celery app: one task, bound to one lane's handler and pool."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any
from weakref import WeakKeyDictionary

from celery import Celery, Task
from celery.worker.control import inspect_command

from dataservice.broker import broker_for
from dataservice.broker.celery import TASK_NAME, celery_app
from dataservice.broker.failover import EpochKeeper
from dataservice.broker.library import LibraryKeeper
from dataservice.broker.results import ResultStore
from dataservice.cache.runtime import CacheRuntime
from dataservice.config.budget import pool_size
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.handler import Database, build_handler
from dataservice.handler.steps import Admitted, Opened
from dataservice.limits.admission import (
    DEADLINE_HEADER,
    OPS_HEADER,
    SIZE_HEADER,
    lane_admission_bounds,
)
from dataservice.limits.gate import Gate
from dataservice.limits.permits import PERMITS_COMMAND, LanePermits
from dataservice.observe.metrics import DEPENDENCY_FAILURES, Dependency
from dataservice.redis import endpoints
from dataservice.redis.bounded import QUIET, within
from dataservice.redis.endpoints import is_sentinel
from dataservice.redis.packing import packed_connection_class
from dataservice.security.auth import Authenticator
from dataservice.security.callers import KeyRing, load_keyring
from dataservice.store import RecordStore, create_store_engine
from dataservice.worker.answers import Answers, int_header
from dataservice.worker.fastpath import redelivered, serve_inline
from dataservice.worker.gauges import LaneGauges
from dataservice.worker.inline import InlineRequests
from dataservice.worker.purger import OutcomePurger
from dataservice.worker.reconnect import reconnect_promptly
from dataservice.worker.servicetimes import ServiceTimesPublisher

log = logging.getLogger(__name__)

# The limits script must answer quickly or not at all: a slow Redis sends the
# gate to its local fallback rather than holding every request.
_LIMITS_TIMEOUT_S = 0.25
_BROKER_CHATTER_TIMEOUT_S = 0.25
_MIN_DELIVERY_S = 0.5
# How long a pool thread tries again to deliver an answer whose Redis cannot
# be reached (a restart takes about a second), within the request's own time:
# the thread, and the message's place in the prefetch window, are held meanwhile.
RETRY_ANSWER_S = 10.0


class LaneRuntime:
    """What one worker process needs to serve a lane: handler, store and results."""

    def __init__(
        self,
        settings: Settings,
        config: Config,
        lane: LaneName,
        threads: int | None = None,
        keyring: KeyRing | None = None,
    ) -> None:
        lane_config = config.lanes[lane]
        keyring = load_keyring(settings.callers_file) if keyring is None else keyring
        self.lane = lane
        threads = lane_config.concurrency if threads is None else threads
        # One connection per worker thread, up to the permits: a thread takes
        # one only while it holds a permit, so it never waits for another's.
        self.engine = create_store_engine(
            settings.database_url, pool_size(threads, lane_config.permits), config.database
        )
        self.permits = LanePermits(lane_config)
        store = RecordStore(
            self.engine,
            max_statement_ms=config.database.max_statement_ms,
            injected_delay_ms=config.database.injected_delay_ms,
            injected_delay_table=config.database.injected_delay_table,
            idempotency_retention_s=config.idempotency.retention_s,
        )
        self._purger = (
            OutcomePurger(store, self.permits, config) if lane is LaneName.BATCH else None
        )
        self.limits_redis = endpoints.client(
            settings.redis_url,
            **QUIET,
            connection_class=packed_connection_class(settings.redis_url),
            socket_timeout=_LIMITS_TIMEOUT_S,
            socket_connect_timeout=_LIMITS_TIMEOUT_S,
            max_connections=threads + 2,
        )
        gate = Gate(
            self.limits_redis,
            config,
            on_fallback=DEPENDENCY_FAILURES.labels(lane.value, Dependency.LIMITS.value).inc,
        )
        database = Database(self.permits, lane_config.permit_wait_ms)
        self.cache = CacheRuntime(settings, config, lane.value, database, store, threads)
        self.handler = build_handler(
            config,
            lane,
            store,
            database,
            Authenticator(keyring, config, lane),
            gate,
            self.cache.source,
        )
        # Bounded: an answer is delivered within what its request has left
        # and the grace it is kept for (see process), never retried past it.
        self.results = ResultStore.from_url(
            settings.result_backend_url, max_waiters=threads + 2, bounded=True
        )
        self._grace_ms = config.results.grace_ms
        self._answers = Answers(
            self.results,
            self.handler,
            lane_config.queue,
            lane,
            slots_with_answers=settings.redis_url == settings.result_backend_url,
        )
        self._deliver = self._answers.deliver
        # The worker's own small talk with admission's Redis (service times,
        # queue gauges): the broker's, or on RabbitMQ the result backend's.
        # Short timeouts, so that a stalled Redis costs a beat, not a thread.
        self._broker = endpoints.client(
            settings.admission_url,
            **QUIET,
            socket_timeout=_BROKER_CHATTER_TIMEOUT_S,
            socket_connect_timeout=_BROKER_CHATTER_TIMEOUT_S,
            max_connections=4,
        )
        self._service_times = ServiceTimesPublisher(
            self._broker,
            lane_admission_bounds(config)[lane_config.queue],
            self.handler.service_times,
        )
        # Queues that are not lists on that Redis are counted by the broker
        # itself, as briefly.
        self._gauges = LaneGauges(
            lane,
            config,
            self.permits,
            self.engine,
            self.cache.controls,
            self._broker,
            broker_for(settings),
            _BROKER_CHATTER_TIMEOUT_S,
        )
        self.inline = InlineRequests(
            self.handler,
            self.cache.source,
            self._answers,
            self.process,
            # kombu's acknowledgement can join the answer's transaction only on one Redis.
            ack_with_answers=settings.broker_url == settings.result_backend_url,
            one_redis=settings.redis_url == settings.result_backend_url,
            record_in_gate=settings.broker_url == settings.redis_url,
        )
        # The publish interface and the configuration it reads, on the
        # broker's Redis (dataservice/broker/library.py).
        self._library = (
            LibraryKeeper(self._broker, config) if broker_for(settings).has_library else None
        )
        # On a Sentinel-managed broker the epoch follows the primary, so that
        # requests a failover lost are reported lost (dataservice/broker/failover.py).
        # Its thread starts last: nothing after it can fail and leave it running.
        self._epochs = (
            EpochKeeper(self._broker, [config.lanes[name].queue for name in LaneName])
            if is_sentinel(settings.broker_url)
            else None
        )

    def process(
        self,
        task_id: str,
        body: object,
        deadline: Any,
        admitted_size: Any = None,
        redelivered: bool = False,
        admitted_ops: Any = None,
        *,
        started: Opened | Admitted | None = None,
        ack: tuple[str, str, str] | None = None,
    ) -> bool:
        """Answer one message (``started``: as far as the consumer thread took
        it), with ``ack`` acknowledging it in the answer's own step; whatever
        happens, its bytes go back to admission: the size admission counted
        (its header), else the body's. False if the answer could not be stored."""
        reply = None
        try:
            reply = self.handler.handle(
                task_id,
                body,
                int_header(deadline),
                redelivered=redelivered,
                started=started,
            )
        except Exception as exc:
            # A bug, not a request's fault: answer INTERNAL rather than leave
            # the caller waiting for its deadline.
            log.error("unexpected %s on %s", type(exc).__name__, task_id, exc_info=True)
            reply = self.handler.internal_error("", task_id, int_header(deadline))
        finally:
            # Worth waiting for until the caller stops waiting (its deadline and
            # the answer's grace), and never less than a moment: the request's
            # bytes go back to admission with it.
            until_ms = (int_header(deadline) or 0) + self._grace_ms
            bound_s = max((until_ms - time.time() * 1000) / 1000, _MIN_DELIVERY_S)
            with within(bound_s):
                stored = self._deliver(
                    task_id,
                    reply,
                    body,
                    admitted_size,
                    ack,
                    admitted_ops,
                    retry_for_s=min(bound_s, RETRY_ANSWER_S),
                )
        return stored

    def close(self) -> None:
        self._service_times.stop()
        if self._library is not None:
            self._library.stop()
        if self._epochs is not None:
            self._epochs.stop()
        self._gauges.close()
        self._broker.close()
        if self._purger is not None:
            self._purger.stop()
        self.engine.dispose()
        self.cache.close()
        self.results.close()
        self.limits_redis.close()


# The runtime serving each app, for control commands (which receive the app).
_RUNTIMES: WeakKeyDictionary[Celery, LaneRuntime] = WeakKeyDictionary()


@inspect_command(name=PERMITS_COMMAND)
def _permits(state: Any) -> dict[str, Any]:
    """The replica's permit gauge, over Celery's control channel."""
    runtime = _RUNTIMES.get(state.consumer.app)
    if runtime is None:
        return {}
    return {"lane": runtime.lane.value, **asdict(runtime.permits.snapshot())}


def register_task(app: Celery, runtime: LaneRuntime) -> None:
    """Register the request task on ``app``, served by ``runtime``.

    The task takes any arguments (``typing=False``) so that a message of the
    wrong shape still reaches the handler, which counts it as malformed (and
    answers the caller it names, if any) rather than Celery dropping it unseen.
    """

    _RUNTIMES[app] = runtime

    # Not shared: each app (one per lane runtime) has its own handler.
    @app.task(name=TASK_NAME, bind=True, typing=False, ignore_result=True, shared=False)
    def handle(self: Task, *args: Any, **kwargs: Any) -> None:
        request = self.request
        runtime.process(
            request.id,
            args[0] if len(args) == 1 and not kwargs else None,
            getattr(request, DEADLINE_HEADER, None),
            getattr(request, SIZE_HEADER, None),
            redelivered(request),
            getattr(request, OPS_HEADER, None),
        )

    # Cache hits are answered on the consumer thread; everything else goes on
    # to the pool as above (dataservice/worker/fastpath.py).
    serve_inline(handle, runtime.inline)


def create_app(
    settings: Settings, config: Config, lane: LaneName, threads: int | None = None
) -> tuple[Celery, LaneRuntime]:
    """A Celery app whose task serves ``lane``, and the runtime behind it."""
    app = celery_app("dataservice", settings, config)
    reconnect_promptly(app)
    runtime = LaneRuntime(settings, config, lane, threads)
    register_task(app, runtime)
    return app, runtime

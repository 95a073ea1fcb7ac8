"""The worker's Celery app: one task, bound to one lane's handler and pool."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from typing import Any
from weakref import WeakKeyDictionary

import redis
from celery import Celery, Task
from celery.worker.control import inspect_command

from dataservice.auth import Authenticator
from dataservice.broker import TASK_NAME, celery_app
from dataservice.callers import KeyRing, load_keyring
from dataservice.config import Config
from dataservice.enums import LaneName, OperationClass
from dataservice.keys import admission_key
from dataservice.limits.admission import DEADLINE_HEADER, SIZE_HEADER
from dataservice.limits.gate import Gate
from dataservice.limits.permits import PERMITS_COMMAND, LanePermits
from dataservice.metrics import DEPENDENCY_FAILURES, Dependency
from dataservice.results import Completion, ResultStore
from dataservice.settings import Settings
from dataservice.store import Bounds, RecordStore, create_store_engine
from dataservice.store.connections import now_ms
from dataservice.worker import Database, build_handler

log = logging.getLogger(__name__)

# The limits script must answer quickly or not at all: a slow Redis sends the
# gate to its local fallback rather than holding every request.
_LIMITS_TIMEOUT_S = 0.25


def _int_header(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
        # One connection per worker thread: a thread never waits for another's.
        self.engine = create_store_engine(settings.database_url, threads, config.database)
        self.permits = LanePermits(lane_config)
        self.admission_key = admission_key(lane_config.queue)
        store = RecordStore(
            self.engine,
            max_statement_ms=config.database.max_statement_ms,
            injected_delay_ms=config.database.injected_delay_ms,
            idempotency_retention_s=config.idempotency.retention_s,
        )
        self._stop = threading.Event()
        self._purger: threading.Thread | None = None
        if lane is LaneName.BATCH:
            self._purger = threading.Thread(
                target=self._purge_expired_outcomes,
                args=(store, config),
                name="purge-idempotency",
                daemon=True,
            )
            self._purger.start()
        self.limits_redis = redis.Redis.from_url(
            settings.redis_url,
            socket_timeout=_LIMITS_TIMEOUT_S,
            socket_connect_timeout=_LIMITS_TIMEOUT_S,
            max_connections=threads + 2,
        )
        gate = Gate(
            self.limits_redis,
            config,
            on_fallback=DEPENDENCY_FAILURES.labels(lane.value, Dependency.LIMITS.value).inc,
        )
        database = Database(self.permits, config.database.pool_timeout_ms)
        self.handler = build_handler(
            config, lane, store, database, Authenticator(keyring, config, lane), gate
        )
        self.results = ResultStore.from_url(
            settings.result_backend_url,
            max_waiters=threads + 2,
        )
        self._slots_with_answers = settings.redis_url == settings.result_backend_url

    def process(
        self,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        deadline: Any,
        admitted_size: Any = None,
    ) -> None:
        """Answer one message; whatever happens, its bytes go back to admission:
        the size admission counted (its header), else the body's."""
        body: object = args[0] if len(args) == 1 and not kwargs else None
        size = _int_header(admitted_size)
        if size is None:
            size = len(body) if isinstance(body, bytes) else 0
        reply = None
        try:
            reply = self.handler.handle(task_id, body, _int_header(deadline))
        except Exception as exc:
            # A bug, not a request's fault: answer INTERNAL rather than leave
            # the caller waiting for its deadline.
            log.error("unexpected %s on %s", type(exc).__name__, task_id, exc_info=True)
            reply = self.handler.internal_error("", task_id, _int_header(deadline))
        finally:
            # The in-flight slot goes back in the answer's own transaction when
            # both live on one Redis: one round trip fewer per request.
            slot = reply.slot if reply is not None else None
            shared = slot is not None and self._slots_with_answers
            inflight = Gate.slot_member(slot) if slot is not None and shared else None
            done = Completion(self.admission_key, size, inflight)
            try:
                self.handler.release(reply, released_in_redis=inflight is not None)
                if reply is None or not reply.caller:
                    self.results.complete(done)
                else:
                    self.results.put(reply.caller, task_id, reply.body, reply.expires_at_ms, done)
            except redis.RedisError as exc:
                # The work is done; its caller sees DEADLINE_EXCEEDED and may retry.
                DEPENDENCY_FAILURES.labels(self.lane.value, Dependency.RESULTS.value).inc()
                log.warning("could not deliver the answer to %s: %s", task_id, type(exc).__name__)

    def _purge_expired_outcomes(self, store: RecordStore, config: Config) -> None:
        """Delete expired idempotency outcomes, one bounded statement at a time,
        each under a batch-lane write permit like any other write."""
        settings = config.idempotency
        while not self._stop.wait(settings.purge_interval_s):
            try:
                while not self._stop.is_set():
                    with self.permits.acquire(OperationClass.POINT_WRITE, 1.0) as permit:
                        deadline = now_ms() + config.database.max_statement_ms
                        purged = store.purge_idempotency(
                            settings.purge_batch, Bounds(permit, deadline)
                        )
                    if purged < settings.purge_batch:
                        break
            except Exception as exc:
                # Whatever went wrong (the database away, a connect ramp, no
                # permit), the next round tries again: the thread must not end.
                log.warning("purging expired idempotency outcomes: %s", type(exc).__name__)

    def close(self) -> None:
        self._stop.set()
        if self._purger is not None:
            self._purger.join(5)
        self.engine.dispose()
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
            args,
            kwargs,
            getattr(request, DEADLINE_HEADER, None),
            getattr(request, SIZE_HEADER, None),
        )


def create_app(
    settings: Settings, config: Config, lane: LaneName, threads: int | None = None
) -> tuple[Celery, LaneRuntime]:
    """A Celery app whose task serves ``lane``, and the runtime behind it."""
    app = celery_app("dataservice", settings, config)
    runtime = LaneRuntime(settings, config, lane, threads)
    register_task(app, runtime)
    return app, runtime

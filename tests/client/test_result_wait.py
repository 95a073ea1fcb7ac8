"""A caller's wait for its answer is a series of BLPOP slices (the handle looks
at the broker's epoch between them). Redis ends each slice by its own clock,
from when it runs the command, so its wait may end later than the caller's
socket expects; an answer popped in that gap must still reach the caller, not
leave with a connection the caller has already closed."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import redis
from dataservice_tools.localservices import PrivateRedis

from dataservice.broker.results import ResultStore
from dataservice.redis.keys import result_key

SLICE_S = 0.1
ANSWER = b"an answer due just after the slice"


def test_an_answer_popped_after_the_slice_ends_by_the_callers_clock_reaches_it(
    private_redis: PrivateRedis,
) -> None:
    """Redis is stopped when the BLPOP is sent and runs it 300 ms late, 200 ms
    after the slice ended by the caller's clock; the answer pushed meanwhile is
    popped for it as soon as it runs, and the caller, still reading, gets it."""
    store = ResultStore.from_url(private_redis.url, bounded=True)
    pusher = redis.Redis.from_url(private_redis.url)
    pusher.ping()
    request_id = uuid.uuid4().hex

    def late_answer() -> None:
        time.sleep(0.2)
        threading.Thread(
            target=pusher.rpush, args=(result_key("tests", request_id), ANSWER)
        ).start()
        time.sleep(0.1)
        private_redis.signal(signal.SIGCONT)

    driver = threading.Thread(target=late_answer)
    private_redis.signal(signal.SIGSTOP)
    driver.start()
    try:
        began = time.monotonic()
        body = store.wait("tests", request_id, SLICE_S, patience_s=2.0)
        took = time.monotonic() - began
        assert body == ANSWER
        assert took < 1.0, took
        # Taken once: nothing is left for a second wait to find.
        assert store.wait("tests", request_id, 0.0) is None
    finally:
        driver.join()
        private_redis.signal(signal.SIGCONT)
        store.close()
        pusher.close()


def test_without_more_patience_a_slice_keeps_to_its_own_time(
    private_redis: PrivateRedis,
) -> None:
    """The bound a caller with no time beyond the slice keeps: the slice and
    the bounded calls' slack (and a busy machine's scheduling), even with
    Redis stopped."""
    store = ResultStore.from_url(private_redis.url, bounded=True)
    store.wait("tests", uuid.uuid4().hex, 0.0)  # connected before Redis stops
    try:
        private_redis.signal(signal.SIGSTOP)
        began = time.monotonic()
        assert store.wait("tests", uuid.uuid4().hex, SLICE_S) is None
        assert time.monotonic() - began < SLICE_S + 0.3
    finally:
        private_redis.signal(signal.SIGCONT)
        store.close()

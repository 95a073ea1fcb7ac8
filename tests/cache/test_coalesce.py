"""In-process coalescing and the cache's breaker, on their own."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dataservice.cache.breaker import Breaker, BreakerState
from dataservice.cache.coalesce import Coalescer, FollowerTimedOut, LeaderFailed
from dataservice.config.cache import BreakerConfig


class Slow:
    """A read that blocks until released, counting how often it ran."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> str:
        self.calls += 1
        self.started.set()
        assert self.release.wait(5)
        return "record"


def test_concurrent_misses_of_one_key_share_one_read_and_leave_no_entry() -> None:
    coalescer: Coalescer[str] = Coalescer(max_keys=10)
    read = Slow()
    with ThreadPoolExecutor(8) as pool:
        leader = pool.submit(coalescer.run, "k", read, 5)
        assert read.started.wait(5)
        followers = [pool.submit(coalescer.run, "k", read, 5) for _ in range(7)]
        time.sleep(0.05)
        read.release.set()
        assert leader.result() == "record"
        assert [f.result() for f in followers] == ["record"] * 7
    assert read.calls == 1
    assert len(coalescer) == 0


def test_a_failed_read_reaches_its_followers_and_leaves_no_entry() -> None:
    coalescer: Coalescer[str] = Coalescer(max_keys=10)
    started, release = threading.Event(), threading.Event()

    def failing() -> str:
        started.set()
        release.wait(5)
        raise RuntimeError("database gone")

    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(coalescer.run, "k", failing, 5)
        assert started.wait(5)
        follower = pool.submit(coalescer.run, "k", failing, 5)
        time.sleep(0.05)
        release.set()
        with pytest.raises(RuntimeError):
            leader.result()
        with pytest.raises(LeaderFailed) as failed:
            follower.result()
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert len(coalescer) == 0


def test_an_unwinding_leader_leaves_no_entry() -> None:
    """A leader's thread unwinding (an exception that is not an error,
    such as a cancellation) still removes the key."""
    coalescer: Coalescer[str] = Coalescer(max_keys=10)

    def cancelled() -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        coalescer.run("k", cancelled, 1)
    assert len(coalescer) == 0
    assert coalescer.run("k", lambda: "again", 1) == "again"


def test_a_follower_that_gives_up_does_not_disturb_the_leader() -> None:
    coalescer: Coalescer[str] = Coalescer(max_keys=10)
    read = Slow()
    with ThreadPoolExecutor(3) as pool:
        leader = pool.submit(coalescer.run, "k", read, 5)
        assert read.started.wait(5)
        impatient = pool.submit(coalescer.run, "k", read, 0.05)
        patient = pool.submit(coalescer.run, "k", read, 5)
        with pytest.raises(FollowerTimedOut):
            impatient.result()
        read.release.set()
        assert leader.result() == "record"
        assert patient.result() == "record"
    assert read.calls == 1


def test_the_map_is_bounded_beyond_it_a_miss_reads_on_its_own() -> None:
    coalescer: Coalescer[str] = Coalescer(max_keys=1)
    read = Slow()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(coalescer.run, "a", read, 5)
        assert read.started.wait(5)
        assert coalescer.run("b", lambda: "alone", 1) == "alone"
        assert len(coalescer) == 1
        read.release.set()
        assert first.result() == "record"
    assert len(coalescer) == 0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_after_failures_in_a_row_and_probes_once() -> None:
    clock, states = Clock(), []
    breaker = Breaker(BreakerConfig(failures=3, open_ms=1000), states.append, clock)
    breaker.failed()
    breaker.succeeded()  # a success in between starts the count again
    breaker.failed()
    breaker.failed()
    assert breaker.allows()
    breaker.failed()
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allows()
    clock.now += 1.0
    assert breaker.allows()  # the one probe
    assert breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allows()
    breaker.failed()  # the probe failed: open again, for another open_ms
    assert not breaker.allows()
    clock.now += 1.0
    assert breaker.allows()
    breaker.succeeded()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allows()
    assert states == [
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.CLOSED,
    ]


class MsClock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_a_finished_read_answers_requests_sent_before_it_ended_and_no_later_one() -> None:
    clock = MsClock()
    reads: list[str] = []

    def read() -> str:
        reads.append("read")
        clock.now += 600  # the read takes 600 ms
        return f"record {len(reads)}"

    coalescer: Coalescer[str] = Coalescer(max_keys=10, keep_ms=5_000, clock=clock)
    assert coalescer.run("k", read, 5, issued_ms=1_000) == "record 1"  # ended at 1,600
    # Sent while it ran (a wave the threads reached only after it ended): its answer.
    assert coalescer.run("k", read, 5, issued_ms=1_400) == "record 1"
    assert coalescer.run("k", read, 5, issued_ms=1_600) == "record 1"
    # Sent after it ended: a read of its own.
    assert coalescer.run("k", read, 5, issued_ms=1_601) == "record 2"
    # Without a send time (a PRIMARY read would have none): never a finished read's.
    assert coalescer.run("k", read, 5) == "record 3"
    assert len(reads) == 3


def test_a_finished_read_is_kept_only_so_long_and_for_so_many_keys() -> None:
    clock = MsClock()
    coalescer: Coalescer[str] = Coalescer(max_keys=2, keep_ms=1_000, clock=clock)
    for key in ("a", "b", "c"):
        coalescer.run(key, lambda key=key: f"first {key}", 5, issued_ms=clock.now)
    # "a" made way for "c": two keys at most.
    assert coalescer.run("a", lambda: "again a", 5, issued_ms=0) == "again a"
    assert coalescer.run("c", lambda: "again c", 5, issued_ms=0) == "first c"
    clock.now += 1_000
    assert coalescer.run("c", lambda: "again c", 5, issued_ms=0) == "again c"

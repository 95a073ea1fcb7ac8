"""The open-loop generator: it offers its rate whatever the answers do, and
keeps apart the failures a caller would act on differently."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from dataservice_tools.loadtest.openloop import OpenLoop, Outcome, classify

from dataservice.enums import LaneName
from dataservice.errors import DeadlineExceeded, NotFound, ResourceExhausted, Unavailable

LANE = LaneName.INTERACTIVE
ANSWERS: tuple[Exception | None, ...] = (
    None,
    ResourceExhausted("over the rate"),
    Unavailable("database down"),
    DeadlineExceeded("too late"),
    ValueError("adapter bug"),
)


def test_each_kind_of_failure_keeps_its_own_outcome() -> None:
    assert classify(ResourceExhausted("x")) is Outcome.REJECTED
    assert classify(Unavailable("x")) is Outcome.UNAVAILABLE
    assert classify(DeadlineExceeded("x")) is Outcome.TIMEOUT
    assert classify(NotFound("x")) is Outcome.ERROR
    assert classify(RuntimeError("x")) is Outcome.ERROR


class SlowAdapter:
    """Answers in turn with each of ANSWERS, each after 50 ms."""

    def __init__(self) -> None:
        self._answers = itertools.cycle(ANSWERS)
        self._lock = threading.Lock()

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> None:
        with self._lock:
            answer = next(self._answers)
        time.sleep(0.05)
        if answer is not None:
            raise answer

    def close(self) -> None:
        pass


@pytest.mark.timeout(30)
def test_arrivals_keep_their_schedule_and_every_outcome_is_recorded() -> None:
    loop = OpenLoop(
        SlowAdapter(),
        lambda _lane, _t: 100.0,
        {LANE: 1.0},
        ["a", "b"],
        b"",
        duration_s=1.0,
        t0=time.monotonic() + 0.2,
        max_callers=50,
        read_share={LANE: 1.0},
    )
    loop.start(callers=10)
    loop.join()
    records = loop.records
    # 100/s for 1 s, though each answer takes 50 ms: the pool grew, the rate held.
    assert len(records) == loop.scheduled[LANE] in (100, 101)
    assert loop.callers > 1
    counts = {o: sum(1 for r in records if r.outcome is o) for o in Outcome}
    assert all(count >= 20 for count in counts.values()), counts
    assert {r.detail for r in records if r.outcome is Outcome.UNAVAILABLE} == {str(ANSWERS[2])}
    assert all(r.detail == "" for r in records if r.outcome is Outcome.OK)

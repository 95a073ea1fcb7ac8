"""Pauses of the machine itself, measured beside a run.

A caller's latency includes whatever stopped the whole machine for a moment (a
virtual machine's stolen time, memory reclaim, a burst of other work): a
refusal that costs a millisecond of work takes 140 ms if the machine stood
still for 140 ms of it. :class:`StallMeter` runs a process of its own that does
nothing but sleep ``STEP_S`` at a time (``python -m dataservice_tools.loadtest.stalls``)
and notes every wake-up later than ``THRESHOLD_S``: what no code of the
service's or the harness's could have caused inside that process. The report
carries them (``machine_stalls``) so that a latency can be read against them;
the reduced-size tests allow the worst of them on top of their bounds, and no
more. Both processes read ``CLOCK_MONOTONIC``, one clock for the whole machine.
"""

from __future__ import annotations

import contextlib
import gc
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

STEP_S = 0.005
# Below this, a late wake-up is ordinary scheduling on a busy machine.
THRESHOLD_S = 0.01


def stop_child(process: subprocess.Popen[str] | None, reader: threading.Thread | None) -> None:
    """End a helper process of the harness's and the thread that reads its lines."""
    if process is None:
        return
    process.terminate()
    process.wait(5)
    if reader is not None:
        reader.join(5)
    if process.stdout is not None:
        process.stdout.close()


@dataclass(frozen=True, slots=True)
class Stall:
    at: float  # monotonic seconds when the sleeper woke
    seconds: float  # how much later than asked


class HarnessPauses:
    """The harness's own garbage collection, kept out of the callers' latency.

    A full collection walks every object the process holds, with every other
    thread waiting: in a large process (a test session's) that is a pause of
    hundreds of milliseconds, charged to whichever calls it caught. For the
    measured part of a run, what exists at its start is frozen (left out of
    collections: nothing of it is garbage yet), and the collections that do
    happen are timed (``generator.gc_pauses`` in the report).
    """

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._began = 0.0

    def _time(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._began)

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._time)

    def stop(self) -> None:
        if self._time in gc.callbacks:
            gc.callbacks.remove(self._time)
            gc.unfreeze()

    def summary(self) -> dict[str, Any]:
        return {
            "count": len(self.pauses),
            "max_ms": round(max(self.pauses, default=0.0) * 1000, 1),
        }


class HarnessWakes:
    """The same sleeper as a thread of the harness itself: how late any of the
    harness's threads can be to run again. It sees the machine's stalls too,
    and what only this process suffers: its callers, hundreds of threads with
    one interpreter lock, all woken at once when a stalled dependency answers
    again, take turns, and a caller whose socket timed out on time returns
    late by its wait for the turn (not a delay a caller process of a few
    threads would see)."""

    def __init__(self) -> None:
        self.stalls: list[Stall] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-wakes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            stall = sleep_step()
            if stall is not None:
                self.stalls.append(stall)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


class StallMeter:
    """The sleeper process, started and stopped around the measured part of a
    run, the same sleeper in the harness (:class:`HarnessWakes`) and the
    harness's own collections (:class:`HarnessPauses`)."""

    def __init__(self) -> None:
        self.stalls: list[Stall] = []
        self.harness = HarnessPauses()
        self.wakes = HarnessWakes()
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.harness.start()
        self.wakes.start()
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdout=subprocess.PIPE, text=True
        )
        stdout = self._process.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=self._read, args=(stdout,), daemon=True)
        self._reader.name = "stall-meter"
        self._reader.start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            at, late = line.split()
            self.stalls.append(Stall(float(at), float(late)))

    def stop(self) -> None:
        self.harness.stop()
        self.wakes.stop()
        stop_child(self._process, self._reader)
        self._process = None

    def summary(self, t0: float) -> dict[str, Any]:
        return {
            **summary(self.stalls, t0),
            "harness_gc": self.harness.summary(),
            "harness_wakes": summary(self.wakes.stalls, t0),
        }


def summary(stalls: list[Stall], t0: float) -> dict[str, Any]:
    """For the report: how many, the worst and the total (ms), and each one's
    time in the run (seconds from ``t0``)."""
    return {
        "threshold_ms": THRESHOLD_S * 1000,
        "count": len(stalls),
        "max_ms": round(max((s.seconds for s in stalls), default=0.0) * 1000, 1),
        "total_ms": round(sum(s.seconds for s in stalls) * 1000, 1),
        "at_s": [round(s.at - t0, 2) for s in stalls[:100]],
    }


def sleep_step() -> Stall | None:
    """Sleep ``STEP_S``; the stall, if the wake-up came ``THRESHOLD_S`` or more late."""
    asked = time.monotonic() + STEP_S
    time.sleep(STEP_S)
    woke = time.monotonic()
    return Stall(woke, woke - asked) if woke - asked >= THRESHOLD_S else None


def main() -> None:
    while True:
        stall = sleep_step()
        if stall is not None:
            print(f"{stall.at:.6f} {stall.seconds:.6f}", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        main()

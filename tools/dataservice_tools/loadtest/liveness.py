"""Liveness over a run, as an orchestrator would see it.

Every service replica runs with ``--alive-file``; a watcher thread runs the
check ``dataservice health --alive-file`` runs (:func:`dataservice.ops.health.liveness`:
the broker answers a PING and each alive file is fresh; never the database)
at ``TARGET_HZ``, on the files of the replicas that ought to be live at that
instant. ``max_age_s`` is the command's own default, so a red sample is one
on which a deployed health check would have failed. Each sample also keeps
the oldest file's age, which shows a loop that slowed without failing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataservice.cli.health import DEFAULT_MAX_AGE_S
from dataservice.config.settings import Settings
from dataservice.ops.health import liveness
from dataservice_tools.loadtest.report import sample_hz

TARGET_HZ = 4.0
# Each PING may take this long: a broker slower than that is late for a
# check run four times a second, and the sampling rate stays above 2 Hz.
CHECK_TIMEOUT_S = 0.5

FilesFn = Callable[[float], list[Path]]  # monotonic time -> alive files expected fresh


@dataclass(frozen=True, slots=True)
class LivenessSample:
    t: float  # seconds since the run's start
    ok: bool
    files: int  # alive files checked
    oldest_age_s: float | None  # the stalest of them (None: one missing)
    failed: tuple[str, ...]  # each failing check: its name and what it found


def _oldest_age(paths: Sequence[Path], now: float) -> float | None:
    ages = []
    for path in paths:
        try:
            ages.append(now - path.stat().st_mtime)
        except OSError:
            return None
    return max(ages, default=0.0)


@dataclass
class LivenessWatch:
    settings: Settings
    files: FilesFn
    t0: float
    max_age_s: float = DEFAULT_MAX_AGE_S
    interval_s: float = 1 / TARGET_HZ
    samples: list[LivenessSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            paths = self.files(now)
            checks = liveness(self.settings, paths, self.max_age_s, CHECK_TIMEOUT_S)
            self.samples.append(
                LivenessSample(
                    t=round(now - self.t0, 3),
                    ok=all(c.ok for c in checks),
                    files=len(paths),
                    oldest_age_s=_oldest_age(paths, time.time()),
                    failed=tuple(f"{c.name}: {c.detail}" for c in checks if not c.ok),
                )
            )
            next_tick += self.interval_s
            delay = next_tick - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_tick = time.monotonic()  # behind: check again at once, do not bunch up

    def report(self) -> dict[str, Any]:
        """Every sample, and whether all were green."""
        samples = self.samples
        span = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
        ages = [s.oldest_age_s for s in samples if s.oldest_age_s is not None]
        return {
            "applicable": True,
            "check": "dataservice health --alive-file (broker PING, every alive file fresh)",
            "max_age_s": self.max_age_s,
            "check_timeout_s": CHECK_TIMEOUT_S,
            "samples": len(samples),
            "sample_hz": sample_hz(len(samples), span),
            "red_samples": sum(1 for s in samples if not s.ok),
            "green_throughout": bool(samples) and all(s.ok for s in samples),
            "oldest_alive_file_age_s": round(max(ages), 2) if ages else None,
            "first_failures": sorted({f for s in samples for f in s.failed})[:5],
            "series": {
                "t": [s.t for s in samples],
                "ok": [s.ok for s in samples],
                "files": [s.files for s in samples],
                "oldest_age_s": [
                    None if s.oldest_age_s is None else round(s.oldest_age_s, 2) for s in samples
                ],
            },
        }


def not_applicable(system: str) -> dict[str, Any]:
    """What the report says where no liveness check exists."""
    return {
        "applicable": False,
        "why": f"the {system} baseline's workers have no alive file and no health check: "
        "there is nothing an orchestrator could ask, so no value is given",
    }

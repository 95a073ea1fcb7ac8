"""CPU time of processes, as ``/proc`` counts it (Linux), alone or as the set of
processes a bench measures."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all threads), None if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5); fields[0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def processes_cpu_s(pids: Sequence[int]) -> float | None:
    """The sum of :func:`process_cpu_s` over ``pids``, None if any is unreadable."""
    values = [process_cpu_s(pid) for pid in pids]
    return None if None in values else sum(v for v in values if v is not None)


class Components:
    """CPU-time snapshots of this process (``client``), the worker of the system
    under test (``worker``: its pid, or the pids of a worker that forks, summed)
    and the servers named in ``servers`` (their pids; None where the server is
    not measured)."""

    def __init__(
        self, workers: Mapping[str, int | Sequence[int]], servers: dict[str, int | None]
    ) -> None:
        self._workers = {
            name: (pids,) if isinstance(pids, int) else tuple(pids)
            for name, pids in workers.items()
        }
        self._servers = servers

    def snapshot(self, system: str) -> dict[str, float | None]:
        return {
            "client": time.process_time(),
            "worker": processes_cpu_s(self._workers[system]),
            **{part: process_cpu_s(pid) if pid else None for part, pid in self._servers.items()},
        }

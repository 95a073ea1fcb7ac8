"""CPU time of processes, as ``/proc`` counts it (Linux)."""

from __future__ import annotations

import os
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

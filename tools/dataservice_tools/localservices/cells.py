"""Three cells' Redis on this machine, for trying cells out and for the tests'
topology (docs/operations.md, "Cells"): cell a a Sentinel-managed primary
with a replica and three Sentinels, cells b and c a ``redis-server`` each, all
from the one ``redis-server`` binary under ``<state dir>/cells``, nothing
persisted; and the cells file that names them (``cells.yml`` there, mode 600).

``python -m dataservice_tools.localservices cells`` (``make cells``) starts
them, or finds them running; ``down`` (``make stop-services``) stops them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from pathlib import Path

import yaml

from dataservice_tools.localservices.probes import redis_reachable, wait_until
from dataservice_tools.localservices.redisserver import PrivateRedis
from dataservice_tools.localservices.sentinel import SentinelGroup

CELLS = ("a", "b", "c")
SENTINEL_NAME = "cell-a"


def cells_dir(state_dir: Path) -> Path:
    return state_dir / "cells"


def cells_up(state_dir: Path) -> tuple[Path, bool]:
    """The cells file, and whether the cells had to be started (False: they
    were running already)."""
    root = cells_dir(state_dir)
    cells_file = root / "cells.yml"
    if cells_file.exists() and _all_answer(cells_file):
        return cells_file, False
    cells_down(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    group = SentinelGroup(root / "a", name=SENTINEL_NAME, sentinels=3).start()
    urls = {"a": group.url()}
    for cell in CELLS[1:]:
        server = PrivateRedis(root / cell)
        server.start()
        urls[cell] = server.url
    cells_file.touch(mode=0o600)
    cells_file.write_text(
        yaml.safe_dump({"cells": {cell: {"redis_url": url} for cell, url in urls.items()}})
    )
    return cells_file, True


def _all_answer(cells_file: Path) -> bool:
    try:
        cells = yaml.safe_load(cells_file.read_text())["cells"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return False
    return all(redis_reachable(entry["redis_url"]) for entry in cells.values())


def cells_down(state_dir: Path) -> list[str]:
    """Stop every server and Sentinel under the cells' directory."""
    root = cells_dir(state_dir)
    pids = []
    for pidfile in [*root.glob("**/redis.pid"), *root.glob("**/sentinel.pid")]:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            # A pidfile outlives its process (a SIGKILL, a reboot): its pid may be
            # another program's by now.
            if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
        pidfile.unlink(missing_ok=True)
    for pid in pids:
        wait_until(functools.partial(_gone, pid), f"redis-server (pid {pid}) to stop")
    return [f"cells' redis ({len(pids)} processes)"] if pids else []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError):
        # A zombie has let go of its ports.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return False

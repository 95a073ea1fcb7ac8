"""A flood: one caller reading at many times its rate beside another that never
nears its own, over interactive worker replicas.

The two callers' policies go into a run's ``queues.yml`` (:func:`write_config`);
:class:`Flooders` send the flood from processes of their own, and
:func:`run_phase` measures one phase: the steady caller, with the flood or
without it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dataservice.client import Client
from dataservice.config.model import ClientConfig, Config, RetryConfig, load_config
from dataservice.config.settings import Settings
from dataservice_tools.loadtest.openloop import RequestRecord
from dataservice_tools.testkit.cpu import process_cpu_s
from dataservice_tools.testkit.openloop import open_loop

FLOODER = "flooder"
STEADY = "steady"
SCOPE = "flood"


# Configuration -------------------------------------------------------------------------


def policies(flooder_rate: float, flooder_burst: int) -> dict[str, dict[str, Any]]:
    """The two callers' entries for ``queues.yml``: only the flooder's rate binds."""
    read_only = {"scopes": [SCOPE], "operations": ["read"], "lanes": ["interactive"]}
    return {
        FLOODER: {**read_only, "rate_per_s": flooder_rate, "burst": flooder_burst,
                  "max_interactive": 256},
        STEADY: {**read_only, "rate_per_s": 100_000, "burst": 10_000, "max_interactive": 10_000},
    }  # fmt: skip


def write_config(
    document: dict[str, Any], path: Path, flooder_rate: float, flooder_burst: int
) -> Config:
    """``document`` (a parsed queues.yml) with the two callers added, written to ``path``."""
    data = dict(document)
    data["callers"] = {**document.get("callers", {}), **policies(flooder_rate, flooder_burst)}
    path.write_text(
        "# Written for one flood run.\n" + yaml.safe_dump(data, sort_keys=False),
        encoding="utf-8",
    )
    return load_config(path)


def one_attempt(config: Config) -> Config:
    """The same configuration with client retries off: each refusal reaches the caller."""
    retry = config.client.retry
    single = RetryConfig(
        max_attempts=1, backoff_base_ms=retry.backoff_base_ms, backoff_max_ms=retry.backoff_max_ms
    )
    return config.model_copy(update={"client": ClientConfig(retry=single)})


# Flood processes ---------------------------------------------------------------------


def _flood_child(
    conn: Any, settings: Settings, config: Config, load: Load, offset: float, threads: int
) -> None:
    """A flooding process: ready, then one open-loop run per (t0, seconds, ids) it is sent."""
    clients = [Client(load.caller, settings, config) for _ in range(-(-threads // 8))]
    try:
        conn.send("ready")
        while (order := conn.recv()) is not None:
            t0, seconds, ids = order
            samples = open_loop(clients, load.scope, ids, load.rate, t0 + offset, seconds, threads)
            conn.send(samples)
    finally:
        for client in clients:
            client.close()


@dataclass(frozen=True)
class Load:
    caller: str
    scope: str
    rate: float  # requests/s from one process


class Flooders:
    """``processes`` processes sending ``caller``'s reads at ``rate``/s between them,
    their arrivals interleaved. Each has its own interpreter, so the flood's client
    work never holds the GIL of the process that measures the other caller."""

    def __init__(
        self,
        settings: Settings,
        config: Config,
        caller: str,
        scope: str,
        rate: float,
        processes: int,
        threads: int,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.rate = rate
        self._pipes: list[Any] = []
        self.processes: list[Any] = []
        load = Load(caller, scope, rate / processes)
        for n in range(processes):
            parent, child = context.Pipe()
            process = context.Process(
                target=_flood_child,
                args=(child, settings, config, load, n / rate, threads),
                daemon=True,
                name=f"flooder-{n}",
            )
            process.start()
            child.close()
            self._pipes.append(parent)
            self.processes.append(process)
        for pipe in self._pipes:
            if not pipe.poll(60) or pipe.recv() != "ready":
                raise RuntimeError("a flood process did not start")

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def go(self, t0: float, seconds: float, ids: Sequence[str]) -> None:
        for pipe in self._pipes:
            pipe.send((t0, seconds, list(ids)))

    def collect(self, timeout_s: float) -> list[RequestRecord]:
        samples: list[RequestRecord] = []
        for pipe in self._pipes:
            if not pipe.poll(timeout_s):
                raise RuntimeError("a flood process did not report")
            samples.extend(pipe.recv())
        return samples

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


# Phases --------------------------------------------------------------------------------


@dataclass
class Phase:
    seconds: float
    steady: list[RequestRecord]
    flood: list[RequestRecord]
    cpu_s: dict[str, float | None]


def _cpu(pids: dict[str, list[int]]) -> dict[str, float | None]:
    totals: dict[str, float | None] = {}
    for part, group in pids.items():
        values = [process_cpu_s(pid) for pid in group]
        totals[part] = None if any(v is None for v in values) else sum(v or 0.0 for v in values)
    return totals


def run_phase(
    steady_clients: Sequence[Client],
    scope: str,
    ids: Sequence[str],
    steady_rate: float,
    seconds: float,
    flooders: Flooders | None,
    pids: dict[str, list[int]],
) -> Phase:
    """The steady caller at ``steady_rate`` for ``seconds``, with the flood if
    ``flooders``; CPU seconds of each group of ``pids`` over the phase."""
    t0 = time.monotonic() + 0.3
    if flooders is not None:
        flooders.go(t0, seconds, ids)
    before = _cpu(pids)
    steady = open_loop(steady_clients, scope, ids, steady_rate, t0, seconds, threads=8)
    flood = [] if flooders is None else flooders.collect(timeout_s=seconds + 30)
    after = _cpu(pids)
    cpu: dict[str, float | None] = {}
    for part in pids:
        start, end = before[part], after[part]
        cpu[part] = None if start is None or end is None else round(end - start, 2)
    return Phase(seconds, steady, flood, cpu)

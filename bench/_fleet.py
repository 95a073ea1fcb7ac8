"""The processes of ``bench/flood.py`` (and ``tests/test_flood.py``): interactive
worker replicas, the processes that send a flood, and one measured phase.

Replicas are :class:`dataservice.ops.processes.WorkerProcess` es (``dataservice
worker --lane interactive`` with the run's settings, SIGTERMed if this process
dies); they count as ready once each answers a Celery control ping. Flood
processes are ``multiprocessing`` children (spawn).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataservice_tools.loadtest.openloop import RequestRecord

from bench import _env
from bench._openloop import open_loop
from dataservice.broker.glue import celery_app
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering

# Worker replicas -------------------------------------------------------------------


@dataclass
class Replicas:
    """Interactive worker processes, each ``dataservice worker --lane interactive``."""

    settings: Settings
    config: Config
    count: int
    log_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    # Replica n's own settings (a configuration of its own, say), where it has them.
    settings_of: dict[int, Settings] = field(default_factory=dict)
    # Replica n serves its counters on metrics_ports[n] (``--metrics-port``), if given.
    metrics_ports: list[int] = field(default_factory=list)

    def start(self, timeout_s: float = 60.0) -> float:
        """Start them and wait until each answers a control ping; seconds it took."""
        for n in range(self.count):
            log = self.log_dir / f"interactive-{n}.log"
            settings = self.settings_of.get(n, self.settings)
            extra = ["--metrics-port", str(self.metrics_ports[n])] if self.metrics_ports else []
            self.workers.append(
                WorkerProcess.for_lane(settings, LaneName.INTERACTIVE, log, *extra).start()
            )
        control = _control_app(self.settings, self.config)
        try:
            return wait_answering(control, self.workers, timeout_s)
        finally:
            control.close()

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def check_alive(self) -> None:
        for worker in self.workers:
            worker.check_alive()

    def stop(self) -> None:
        stop_all(self.workers)


def _control_app(settings: Settings, config: Config) -> Any:

    return celery_app("flood-control", settings, config)


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
        values = [_env.process_cpu_s(pid) for pid in group]
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

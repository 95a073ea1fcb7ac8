"""Interactive worker replicas, started as processes and known to answer.

Replicas are :class:`dataservice.ops.processes.WorkerProcess` es (``dataservice
worker --lane interactive`` with the run's settings, SIGTERMed if this process
dies); they count as ready once each answers a Celery control ping, and
:func:`until_each_answers` shows each one's whole read path is up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataservice.broker.celery import TASK_NAME, celery_app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice_tools.localservices import free_port
from dataservice_tools.testkit.bursts import burst


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
        # Each replica answers on its own broker: those with settings of their
        # own may have another.
        started = time.monotonic()
        by_broker: dict[str, tuple[Settings, list[WorkerProcess]]] = {}
        for n, worker in enumerate(self.workers):
            settings = self.settings_of.get(n, self.settings)
            by_broker.setdefault(settings.broker_url, (settings, []))[1].append(worker)
        for settings, workers in by_broker.values():
            control = _control_app(settings, self.config)
            try:
                wait_answering(control, workers, timeout_s)
            finally:
                control.close()
        return time.monotonic() - started

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def check_alive(self) -> None:
        for worker in self.workers:
            worker.check_alive()

    def stop(self) -> None:
        stop_all(self.workers)


def _control_app(settings: Settings, config: Config) -> Any:
    return celery_app("flood-control", settings, config)


@contextmanager
def replicas(
    settings: Settings,
    config: Config,
    log_dir: Path,
    count: int,
    settings_of: dict[int, Settings] | None = None,
) -> Iterator[Replicas]:
    """``count`` interactive worker processes, each serving its counters on a
    port of its own (``metrics_ports``), answering control pings; stopped on exit."""
    ports = [free_port() for _ in range(count)]
    fleet = Replicas(settings, config, count, log_dir, settings_of=settings_of or {},
                     metrics_ports=ports)  # fmt: skip
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def until_each_answers(
    settings: Settings,
    config: Config,
    workers: Sequence[WorkerProcess],
    caller: str,
    scope: str,
    object_id: str,
    timeout_s: float = 60.0,
) -> int:
    """``PRIMARY`` reads of ``object_id`` (a record that exists), a burst at a
    time, until each of ``workers`` has served one (Celery's per-worker totals);
    how many reads were answered with the record. A control ping shows a
    worker's consumer is up; this shows its whole read path is."""
    control = celery_app("cache-fleet-control", settings, config)
    pending = {worker.pid for worker in workers}
    answered = 0
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(pending)} served no read in {timeout_s} s")
            for worker in workers:
                worker.check_alive()
            reads = [object_id] * 4 * len(workers)
            outcomes = burst(settings, config, caller, scope, reads, len(reads), 10.0,
                             ReadMode.PRIMARY)  # fmt: skip
            answered += sum(o.record is not None for o in outcomes)
            stats = control.control.inspect(timeout=1.0).stats() or {}
            for node in stats.values():
                if node.get("total", {}).get(TASK_NAME, 0) > 0:
                    pending.discard(node.get("pid"))
    finally:
        control.close()
    return answered

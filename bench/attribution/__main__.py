"""Attribution: the same reads over three request paths, and what each change moved.

    .venv/bin/python -m bench.attribution [--quick] [--json out.json]

- **(a) plain Celery, JSON**: the old request path. A stock Celery app (JSON,
  Redis broker and result backend, ``send_task().get()``), its task reading
  through the service's ``RecordStore`` (same statement, same engine) with no
  admission, permit or statement timeout, and a plain JSON cache in front.
- **(b) admitted JSON**: the service's components with JSON on the wire and
  in the cache (v1): admission at publish, cache hits answered on the
  consumer thread, misses and database reads under permits through
  ``Database.run``, answers on result lists (``bench/attribution/app.py``).
- **(c) the service**: ``dataservice worker --lane interactive`` and
  ``dataservice.client.Client``: protobuf on the wire, the v2 cache.

Two workloads: **cached** (every record read once first, so every measured
read is a cache hit in each system's own cache) and **database** (no cache:
``PRIMARY`` in (b) and (c)). Payloads of 100 B, 1 KB, 8 KB and 64 KB (random
bytes), each a row, and a weighted mix (``--mix``). Each cell offers the same
open-loop load (``--rate`` requests/s for ``--seconds``), one system at a
time, in ``--rounds`` that alternate the systems' order (and the first
system rotates from size to size), so a machine that drifts weighs on all
three alike. What is measured and
how: ``bench/attribution/measure.py``; the in-process serialization and
compression fixtures: ``bench/attribution/fixtures.py``; the credit of each
change: ``bench/attribution/summary.py``.

Sets everything up itself: a private redis-server on a free port (every
db number on the shared one is taken by tests and benches; its CPU is then
the bench's alone), dbs 1, 2 and 3 for (a), (b) and (c); the MariaDB database
``dataservice_attribution_bench``, dropped and recreated with ``dataservice
db upgrade``, seeded. Workers are subprocesses, stopped on any exit, and
the database is dropped unless ``--keep``.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from dataservice_tools.loadtest.environment import run_callers_file
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.machine import machine_info
from rich.console import Console

from bench import _env
from bench._env import sigterm_as_exit
from bench.attribution.callers import (
    CALLER,
    CellAdapter,
    JsonReader,
    PlainReader,
    Reader,
    ServiceReader,
)
from bench.attribution.fixtures import compression, serialization
from bench.attribution.measure import (
    Probes,
    Round,
    caller_allocations,
    idle_cpu_ms_per_s,
    memory_mb,
    message_sizes,
    run_round,
    summarize,
)
from bench.attribution.prepare import (
    DBS,
    SIZES,
    WORKLOADS,
    environ,
    facts,
    mariadb_pid,
    parse_args,
    seed,
    workers,
    write_config,
)
from bench.attribution.report import print_report
from bench.attribution.summary import SYSTEMS, compression_verdicts, credit, mix_cells
from dataservice.config.model import Limits
from dataservice.config.settings import Settings
from dataservice.ops.processes import WorkerProcess, stop_all


def in_process(args: argparse.Namespace, limits: Limits) -> dict[str, Any]:
    """The serialization and compression fixtures."""
    repeats, min_time = args.fixture_repeats, args.fixture_min_time
    return {
        "serialization": serialization(SIZES, limits, min(args.records, 32), repeats, min_time),
        "compression": compression((1024, 8192, 65536), (8192, 65536), repeats, min_time),
    }


class Run:
    """One run: what it starts, measures and stops."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.console = Console() if sys.stdout.isatty() else Console(width=200)
        self.directory = Path(tempfile.mkdtemp(prefix="dataservice-attribution-"))
        self.redis = PrivateRedis(self.directory)
        self.urls = {s: f"{self.redis.base}/{db}" for s, db in DBS.items()}
        callers = run_callers_file(self.directory, CALLER)
        self.settings = {
            s: Settings(
                config_path=write_config(self.directory, s, fmt, args.request_lines),
                broker_url=self.urls[s],
                result_backend_url=self.urls[s],
                redis_url=self.urls[s],
                database_url=args.database_url,
                callers_file=callers,
            )
            for s, fmt in (("b", "v1"), ("c", "v2"))
        }
        self.config = {s: settings.load() for s, settings in self.settings.items()}
        self.workers: dict[str, WorkerProcess] = {}
        self.readers: dict[str, Reader] = {}
        self.ids: dict[int, list[str]] = {}
        self.started = time.monotonic()
        self.redis_started = False
        self.failed = True
        self.probes: Probes | None = None

    def setup(self) -> None:
        args, console = self.args, self.console
        with console.status("starting redis-server, creating and seeding the database"):
            self.redis.start()
            self.redis_started = True
            _env.reset_database(args.database_url, environ(self.settings["c"]))
            for size in SIZES:
                self.ids[size] = seed(args.database_url, f"p{size}", args.records, size)
        self.machine = machine_info(self.urls["c"], args.database_url)
        # Before the workers start: in-process figures want a quiet machine.
        with console.status("serialization and compression fixtures"):
            self.fixtures = in_process(args, self.config["c"].limits)
        self.workers = workers(self.urls["a"], self.settings, args.database_url, self.directory)
        for worker in self.workers.values():
            worker.start()
        self.readers = {
            "a": PlainReader(self.urls["a"]),
            "b": JsonReader(self.settings["b"], self.config["b"]),
            "c": ServiceReader(self.settings["c"], self.config["c"]),
        }
        first = self.ids[SIZES[0]][0]
        with console.status("waiting for the workers"):
            for s in SYSTEMS:
                probe = functools.partial(self.readers[s].read, f"p{SIZES[0]}", first, False, 0.5)
                _env.wait_ready(self.workers[s], probe)
        stats = redis.Redis.from_url(f"{self.redis.base}/0")
        self.probes = Probes(stats, self.redis.pid(), mariadb_pid(args.database_url))

    def prepared(self, workload: str, size: int, system: str) -> tuple[CellAdapter, dict[str, Any]]:
        """A system warmed up for a cell, and what its calls put on the wire."""
        args, ids = self.args, self.ids[size]
        adapter = CellAdapter(self.readers[system], f"p{size}", size, workload == "cached")
        if workload == "cached":
            # Every record once first: every measured read is then a hit.
            for object_id in ids:
                adapter.read(object_id, args.timeout)
        self.round(adapter, size, system, args.warmup_seconds)
        sample = ids[: args.captures]
        queue = "attribution" if system == "a" else "interactive"
        return adapter, {
            **message_sizes(adapter, sample, args.timeout, self.redis.port, DBS[system], queue),
            "caller_allocated_bytes": caller_allocations(adapter, sample, args.timeout),
        }

    def round(self, adapter: CellAdapter, size: int, system: str, seconds: float) -> Round:
        if self.probes is None:
            raise RuntimeError("measuring before setup")
        args, worker = self.args, self.workers[system]
        found = run_round(
            adapter, self.ids[size], args.rate, seconds, args.timeout, self.probes, worker.pid
        )
        # A dead worker ends the run, with its log, instead of failing every call.
        worker.check_alive()
        return found

    def cells(self, workload: str, size: int, order: tuple[str, ...]) -> list[dict[str, Any]]:
        """Every system's cell at one size: rounds alternate the systems' order
        (A B C, then C B A), so a machine that drifts weighs on all alike."""
        args, console = self.args, self.console
        # No spinner while measuring: its thread would compete with the callers.
        console.print(f"[dim]{workload}, {size} B: {' '.join(order)}[/dim]")
        prepared = {system: self.prepared(workload, size, system) for system in order}
        rounds: dict[str, list[Round]] = {system: [] for system in order}
        for r in range(args.rounds):
            for system in order if r % 2 == 0 else order[::-1]:
                adapter = prepared[system][0]
                rounds[system].append(self.round(adapter, size, system, args.seconds / args.rounds))
        found = []
        for system in order:
            memory = memory_mb(self.workers[system].pid)
            figures = prepared[system][1]
            found.append(
                {
                    "workload": workload,
                    "system": system,
                    "payload_bytes": size,
                    **summarize(rounds[system]),
                    **figures,
                    "worker_rss_mb": memory["rss_mb"],
                    "worker_hwm_mb": memory["hwm_mb"],
                }
            )
        return found

    def measure(self) -> dict[str, Any]:
        # redis-server's CPU with every worker idle: a background every cell carries.
        idle = idle_cpu_ms_per_s(self.redis.pid(), 0.5 if self.args.quick else 2.0)
        cells = []
        for workload in WORKLOADS:
            for i, size in enumerate(SIZES):
                cells += self.cells(workload, size, SYSTEMS[i % 3 :] + SYSTEMS[: i % 3])
        return assemble(self, cells, idle)

    def cleanup(self) -> None:
        for reader in self.readers.values():
            reader.close()
        if self.probes is not None:
            self.probes.redis.close()
        stop_all(self.workers.values())
        if self.redis_started:
            self.redis.signal(signal.SIGTERM)
        if not self.args.keep:
            _env.drop_database(self.args.database_url)
        if self.failed:
            # The workers' logs say why.
            self.console.print(f"[red]worker logs kept in {self.directory}[/red]")
        else:
            shutil.rmtree(self.directory, ignore_errors=True)


def assemble(run: Run, cells: list[dict[str, Any]], idle: float | None) -> dict[str, Any]:
    """The report: every figure, the mix and the credit."""
    args, fixtures = run.args, run.fixtures
    mix = mix_cells(cells, args.mix_weights)
    for cell in cells:
        del cell["latencies_ms"]
    return {
        "command": " ".join(["python", "-m", "bench.attribution", *sys.argv[1:]]),
        "machine": run.machine,
        "setup": {
            **facts(args),
            "request_lines_c": args.request_lines,
            "concurrency": run.config["c"].lanes.interactive.concurrency,
            "redis_idle_ms_per_s": idle,
            "elapsed_s": round(time.monotonic() - run.started, 1),
        },
        "cells": cells,
        "mix": mix,
        "credit": credit(cells + mix, fixtures["serialization"], args.mix_weights),
        "fixtures": fixtures["serialization"],
        "compression": fixtures["compression"],
        "compression_verdicts": compression_verdicts(fixtures["compression"]),
    }


def main(argv: list[str] | None = None) -> int:
    run = Run(parse_args(argv, __doc__))
    with sigterm_as_exit():
        try:
            run.setup()
            report = run.measure()
            run.failed = False
        except KeyboardInterrupt:
            run.console.print("[red]interrupted[/red]")
            return 130
        finally:
            run.cleanup()
    print_report(run.console, report)
    if run.args.json:
        run.args.json.write_text(json.dumps(report, indent=2) + "\n")
        run.console.print(f"wrote {run.args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

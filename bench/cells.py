"""Balance across cells: the Redis CPU of cached reads, one cell against three.

    .venv/bin/python bench/cells.py [--cells 3] [--callers 12] [--reads 1000]
                                    [--records 200] [--json out.json]

The same ``--callers`` callers (each a thread with its own ``Client``, each a
caller of its own with its own key) read cached records of 1 KB, one after
another, ``--reads`` each, in two phases of the same run:

- **one cell**: every caller on one Redis (a private ``redis-server``) with
  one interactive worker;
- **cells**: ``--cells`` cells, each its own private ``redis-server`` and its
  own interactive worker, the callers spread by the cells' rule
  (``dataservice.config.cells``: bounded-load rendezvous).

Each phase's Redis CPU is ``INFO cpu`` (user + system) of its servers over the
reads, less what as long with nothing asked costs them (the workers' own
chatter: service times, gauges). It reports, per phase, the reads, reads/s
and Redis CPU per read (all of the phase's servers together), and for the
cells, each cell's callers and share of that CPU. The verdicts: the cells'
Redis CPU per read against one cell's (at most 1.1x), and the busiest cell's
share (at most 40 % with three cells). The shipped ``queues.yml`` is run with
the freshness guard off (no change consumer runs here) and two replicas per
cell in the budget. The bench database (``*_bench``) is dropped and made again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import yaml
from dataservice_tools.loadtest.environment import run_callers_file, seed_records
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.machine import machine_info
from rich.console import Console
from rich.table import Table

from bench import _env
from dataservice import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, worker_argv, worker_environ

SCOPE = "cells-bench"
PAYLOAD_BYTES = 1024
TARGET_SUM = 1.1
TARGET_BUSIEST = 0.40


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/cells.py", description=__doc__.split("\n")[0])
    p.add_argument("--cells", type=int, default=3)
    p.add_argument("--callers", type=int, default=12)
    p.add_argument("--reads", type=int, default=1000, help="cached reads per caller and phase")
    p.add_argument("--records", type=int, default=200, help="seeded records of 1 KB")
    p.add_argument(
        "--database-url", default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_cells_bench"
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.cells < 2 or args.callers < args.cells or args.reads < 1:
        p.error("need --cells >= 2, --callers >= --cells and --reads >= 1")
    return args


def _cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Phase:
    """Redis servers, one interactive worker per cell, and the callers' clients."""

    def __init__(
        self, name: str, directory: Path, base: Settings, config: Config, cells: list[str]
    ) -> None:
        self.name = name
        self.cells = cells or [""]
        self.servers = {c: PrivateRedis(directory / f"redis-{c or 'one'}") for c in self.cells}
        self.directory = directory
        self.base = base
        self.config = config
        self.workers: dict[str, WorkerProcess] = {}
        self.clients: list[Client] = []

    def start(self, callers: list[str]) -> None:
        for server in self.servers.values():
            server.start()
        if self.cells == [""]:
            url = self.servers[""].url
            self.base = dataclasses.replace(
                self.base, broker_url=url, result_backend_url=url, redis_url=url
            )
        else:
            cells_file = self.directory / "cells.yml"
            entries = {c: {"redis_url": s.url} for c, s in self.servers.items()}
            cells_file.write_text(yaml.safe_dump({"cells": entries}))
            self.base = dataclasses.replace(self.base, cells_file=cells_file)
        for cell in self.cells:
            # A worker takes its cell's URLs from the cells file itself.
            own = dataclasses.replace(self.base, cell=cell) if cell else self.base
            environ = worker_environ(own)
            environ["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
            )
            log = self.directory / f"worker-{cell or 'one'}.log"
            self.workers[cell] = WorkerProcess(
                worker_argv(LaneName.INTERACTIVE), environ, log, f"interactive {cell}"
            ).start()
        self.clients = [Client(caller, self.base, self.config) for caller in callers]
        for client in self.clients:
            cell = self.config.cell_of(client.caller) or ""
            _env.wait_ready(self.workers[cell], lambda c=client: c.read(SCOPE, "obj-000000"))

    def cpu_s(self) -> dict[str, float]:
        out = {}
        for cell, server in self.servers.items():
            client = redis.Redis.from_url(server.url)
            try:
                out[cell] = _cpu_s(client)
            finally:
                client.close()
        return out

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        stop_all(self.workers.values())
        for server in self.servers.values():
            server.signal(9)


def read_all(clients: list[Client], ids: list[str], reads: int) -> tuple[float, int]:
    """``reads`` cached reads from each client at once; seconds, reads done."""
    failures: list[BaseException] = []
    barrier = threading.Barrier(len(clients) + 1)

    def run(index: int, client: Client) -> None:
        rng = random.Random(index)
        barrier.wait()
        try:
            for _ in range(reads):
                client.read(SCOPE, rng.choice(ids))
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - started
    if failures:
        raise failures[0]
    return took, reads * len(clients)


def measure(phase: Phase, ids: list[str], reads: int) -> dict[str, Any]:
    # Every record read once by each caller: each cell's cache holds it.
    for client in phase.clients:
        for object_id in ids:
            client.read(SCOPE, object_id)
    read_all(phase.clients, ids, max(reads // 5, 1))
    before = phase.cpu_s()
    took, done = read_all(phase.clients, ids, reads)
    busy = phase.cpu_s()
    time.sleep(took)
    idle = phase.cpu_s()
    for worker in phase.workers.values():
        worker.check_alive()
    cpu = {
        cell: max((busy[cell] - before[cell]) - (idle[cell] - busy[cell]), 0.0)
        for cell in phase.cells
    }
    total = sum(cpu.values())
    callers = dict.fromkeys(phase.cells, 0)
    for client in phase.clients:
        callers[phase.config.cell_of(client.caller) or ""] += 1
    return {
        "reads": done,
        "seconds": round(took, 3),
        "reads_per_s": round(done / took, 1),
        "redis_cpu_ms_per_read": round(total * 1000 / done, 4),
        "cells": {
            cell or "one": {
                "callers": callers[cell],
                "redis_cpu_s": round(cpu[cell], 3),
                "share": round(cpu[cell] / total, 3) if total else None,
            }
            for cell in phase.cells
        },
    }


def configs(directory: Path, callers: list[str], cells: list[str]) -> tuple[Path, Path]:
    """queues.yml without cells and with them: the shipped one, unguarded,
    the bench's callers added, two replicas per cell in the budget."""
    document = yaml.safe_load(_env.unguarded_config(directory).read_text(encoding="utf-8"))
    policy = document["callers"][_env.CALLER]
    # The deployment's callers are the bench's alone: the cells' rule balances those.
    document["callers"] = {caller: dict(policy) for caller in callers}
    document["budget"]["max_replicas"] = 2
    one = directory / "one.yml"
    one.write_text(yaml.safe_dump(document, sort_keys=False))
    document["cells"] = {"names": cells, "callers": {}}
    many = directory / "cells.yml.config"
    many.write_text(yaml.safe_dump(document, sort_keys=False))
    return one, many


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=120)
    directory = Path(tempfile.mkdtemp(prefix="dataservice-bench-cells-"))
    callers = [f"cells-bench-{n:02d}" for n in range(args.callers)]
    cells = [f"c{n}" for n in range(args.cells)]
    one_path, many_path = configs(directory, callers, cells)
    callers_file = run_callers_file(directory, *callers)
    base = Settings(config_path=one_path, database_url=args.database_url, callers_file=callers_file)
    _env.reset_database(args.database_url, worker_environ(base))
    ids = seed_records(args.database_url, SCOPE, args.records, PAYLOAD_BYTES)
    results: dict[str, Any] = {}
    phases = [
        ("one cell", base, []),
        ("cells", dataclasses.replace(base, config_path=many_path), cells),
    ]
    for name, settings, named in phases:
        phase_dir = directory / name.replace(" ", "-")
        phase_dir.mkdir()
        phase = Phase(name, phase_dir, settings, settings.load(), named)
        try:
            with console.status(f"{name}: starting"):
                phase.start(callers)
            if not results:
                results["machine"] = machine_info(phase.servers[""].url, args.database_url)
            console.print(f"[dim]{name}: measuring[/dim]")
            results[name] = measure(phase, ids, args.reads)
        finally:
            phase.stop()
    one, many = results["one cell"], results["cells"]
    ratio = many["redis_cpu_ms_per_read"] / one["redis_cpu_ms_per_read"]
    busiest = max(c["share"] or 0.0 for c in many["cells"].values())
    results["verdict"] = {
        "cells_over_one": round(ratio, 3),
        "busiest_share": busiest,
        "met": ratio <= TARGET_SUM and busiest <= TARGET_BUSIEST,
    }
    results["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report(console, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    _env.drop_database(args.database_url)
    return 0


def report(console: Console, results: dict[str, Any]) -> None:
    machine = results["machine"]
    console.print(
        f"machine: {machine.get('cpu_model')}, {machine.get('cpus')} CPUs, "
        f"Python {machine.get('python')}, Redis {machine.get('redis_server')}, "
        f"load {machine.get('loadavg_at_start')}"
    )
    table = Table(title="cached reads, Redis CPU per read")
    for column in ("phase", "reads", "reads/s", "Redis CPU ms/read", "cells: callers, share"):
        table.add_column(column, justify="right")
    for name in ("one cell", "cells"):
        phase = results[name]
        cells = ", ".join(
            f"{cell} {c['callers']} {c['share']:.0%}" if c["share"] is not None else cell
            for cell, c in phase["cells"].items()
        )
        table.add_row(
            name,
            str(phase["reads"]),
            str(phase["reads_per_s"]),
            f"{phase['redis_cpu_ms_per_read']:.4f}",
            cells,
        )
    console.print(table)
    verdict = results["verdict"]
    console.print(
        f"cells' Redis CPU per read / one cell's: {verdict['cells_over_one']:.3f} "
        f"(at most {TARGET_SUM}); busiest cell's share {verdict['busiest_share']:.1%} "
        f"(at most {TARGET_BUSIEST:.0%}): {'met' if verdict['met'] else 'missed'}"
    )


if __name__ == "__main__":
    sys.exit(main())

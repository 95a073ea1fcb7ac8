"""A/B of two service *worker* source trees, same callers, alternating rounds.

    .venv/bin/python bench/worker_ab.py TREE_A TREE_B [--rounds 12] [--read primary]

Measures a worker-side change before it is applied: copy the repository,
change ``dataservice/`` or ``dataservice/worker/`` in the copy, and pass both trees. Each
tree gets its own ``dataservice worker --lane interactive`` (started with
``PYTHONPATH=<tree>``) on its own Redis db (11 and 12 by default) over one
shared bench database. The callers are this checkout's ``Client`` for both, so
only the worker differs. Rounds alternate A B / B A for one caller and for
``--callers`` callers. It prints p50/p99, throughput and worker CPU per
request. Run it with the same tree twice (an A/A control) to see the noise.
Both workers verify with one callers file written to the log directory, so
both trees must understand signed requests (``DATASERVICE_CALLERS_FILE``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataservice_tools.loadtest.environment import flush_redis, run_callers_file, seed_records
from dataservice_tools.testkit.callers import Caller, run_round
from dataservice_tools.testkit.cpu import Components
from dataservice_tools.testkit.series import RunResult, Series
from rich.console import Console
from rich.table import Table

from bench import _env
from bench.roundtrip.systems import PAYLOAD_BYTES, SCOPE, service_factory
from dataservice.client import Client
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.ops.processes import WorkerProcess, worker_argv, worker_environ


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("tree_a", type=Path)
    p.add_argument("tree_b", type=Path)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--callers", type=int, default=16)
    p.add_argument(
        "--read",
        choices=("cached", "primary"),
        default="cached",
        help="ALLOW_CACHED reads (the default) or PRIMARY (the database, under a permit)",
    )
    p.add_argument("--redis", default="redis://127.0.0.1:6379")
    p.add_argument("--dbs", type=int, nargs=2, default=[11, 12], metavar=("A", "B"))
    p.add_argument(
        "--database-url", default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_ab_bench"
    )
    args = p.parse_args(argv)
    if 0 in args.dbs or args.dbs[0] == args.dbs[1]:
        p.error("--dbs must be two different non-zero db numbers")
    return args


_MODES = {"cached": ReadMode.ALLOW_CACHED, "primary": ReadMode.PRIMARY}


def start_worker(
    name: str, tree: Path, url: str, database_url: str, logdir: Path, callers_file: Path
) -> tuple[WorkerProcess, Settings]:
    settings = Settings(
        config_path=_env.REPO / "queues.yml",
        broker_url=url,
        result_backend_url=url,
        redis_url=url,
        database_url=database_url,
        callers_file=callers_file,
    )
    environ = {**worker_environ(settings), "PYTHONPATH": str(tree)}
    argv = worker_argv(LaneName.INTERACTIVE)
    worker = WorkerProcess(argv, environ, logdir / f"{name}.log", name).start()
    return worker, settings


def measure(
    args: argparse.Namespace,
    console: Console,
    callers: list[Caller],
    workers: dict[str, WorkerProcess],
    components: Components,
) -> dict[tuple[str, str], list[RunResult]]:
    phases = {"sequential": (callers[:1], 300), f"{args.callers} callers": (callers, 25)}
    for k in workers:
        for group, per in phases.values():
            run_round(group, k, max(1, per // 2), components)
    runs: dict[tuple[str, str], list[RunResult]] = {(ph, k): [] for ph in phases for k in workers}
    for r in range(args.rounds):
        console.print(f"[dim]round {r + 1}/{args.rounds}[/dim]")
        for phase, (group, per) in phases.items():
            for k in ("A", "B") if r % 2 == 0 else ("B", "A"):
                runs[(phase, k)].append(run_round(group, k, per, components))
                workers[k].check_alive()
    return runs


def print_table(
    console: Console, trees: dict[str, Path], runs: dict[tuple[str, str], list[RunResult]]
) -> None:
    table = Table(title="worker A/B (same callers)")
    for column in ("phase", "tree", "n", "err", "p50 ms", "round p50 median", "p99 ms"):
        table.add_column(column)
    table.add_column("req/s", justify="right")
    table.add_column("worker CPU ms/req", justify="right")
    for phase in dict.fromkeys(ph for ph, _ in runs):
        for k, tree in trees.items():
            s = Series(runs[(phase, k)]).summary()
            cpu = s["cpu_ms_per_request"]["worker"]
            table.add_row(
                phase,
                f"{k}: {tree}",
                str(s["requests"]),
                str(s["errors"]),
                f"{s['p50_ms']:.2f}",
                f"{statistics.median(s['rounds_p50_ms']):.2f}",
                f"{s['p99_ms']:.2f}",
                f"{s['throughput_per_s']:.0f}",
                "-" if cpu is None else f"{cpu:.2f}",
            )
        table.add_section()
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    trees = {"A": args.tree_a.resolve(), "B": args.tree_b.resolve()}
    urls = {k: f"{args.redis}/{db}" for k, db in zip(trees, args.dbs, strict=True)}
    logdir = Path(tempfile.mkdtemp(prefix="dataservice-worker-ab-"))
    workers: dict[str, WorkerProcess] = {}
    callers: list[Caller] = []
    try:
        for url in urls.values():
            flush_redis(url)
        environ = {**worker_environ(), "DATASERVICE_DATABASE_URL": args.database_url}
        _env.reset_database(args.database_url, environ)
        ids = seed_records(args.database_url, SCOPE, 1000, PAYLOAD_BYTES)
        settings: dict[str, Settings] = {}
        callers_file = run_callers_file(logdir, _env.CALLER)
        for k, tree in trees.items():
            workers[k], settings[k] = start_worker(
                k, tree, urls[k], args.database_url, logdir, callers_file
            )
        config = settings["A"].load()
        for k in trees:
            probe = Client(_env.CALLER, settings[k], config)
            try:
                _env.wait_ready(workers[k], partial(probe.read, SCOPE, ids[0], timeout=0.5))
            finally:
                probe.close()
        components = Components(
            {k: w.pid for k, w in workers.items()},
            {
                "redis": _env.find_pid("redis-server"),
                "mariadb": _env.find_pid("mariadbd", "mysqld"),
            },
        )
        factories = {
            k: service_factory(settings[k], config, ids, None, _MODES[args.read]) for k in trees
        }
        callers = [Caller(i, factories) for i in range(args.callers)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.ready.wait()
            if caller.failure is not None:
                raise caller.failure
        print_table(console, trees, measure(args, console, callers, workers, components))
    finally:
        for caller in callers:
            caller.jobs.put(None)
        for worker in workers.values():
            worker.stop()
        for url in urls.values():
            flush_redis(url)
        _env.drop_database(args.database_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())

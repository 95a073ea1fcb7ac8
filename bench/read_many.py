"""``Client.read_many`` against as many single reads: worker CPU per record.

    .venv/bin/python bench/read_many.py [--rounds 40] [--runs 3] [--json out.json]

Sets everything up itself: its own Redis db (``--redis-db``; never db 0)
flushed, the ``dataservice_bench`` database recreated with ``dataservice db
upgrade``, and one ``dataservice worker --lane interactive`` with the shipped
``queues.yml`` as a subprocess. Each round reads 100 ids of 1 KB records: 60
cached (read once before the round, not measured), 35 never read before and
5 that do not exist, a fresh set of ids per round. The two ways take turns,
round by round (A B, then B A, ...):

- **single reads**: one ``Client.read`` per id, one after another;
- **read_many**: one ``Client.read_many`` of the 100 ids.

CPU per record is read from ``/proc`` for the worker (all its threads,
heartbeats and gauges included) and for this process (the caller) over the
measured calls only, and divided by the records asked for; the ratio
single / read_many is the figure. Latency is the wall time of the 100 reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import MySQLdb
from dataservice_tools.loadtest.environment import flush_redis, run_callers_file
from dataservice_tools.testkit.cpu import process_cpu_s
from dataservice_tools.testkit.machine import machine_info
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

from bench import _env
from dataservice.client import Client
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError, NotFound
from dataservice.ops.processes import WorkerProcess, worker_argv, worker_environ
from dataservice.types import Record

SINGLES = "single reads"
MANY = "read_many"
WAYS = (SINGLES, MANY)
IDS, CACHED, MISSING = 100, 60, 5
PAYLOAD_BYTES = 1024
TARGET = 10.0  # single reads' worker CPU per record / read_many's


@dataclass
class Way:
    worker_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    records: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

    def per_record_ms(self, cpu_s: float) -> float:
        return 1000 * cpu_s / self.records if self.records else float("nan")


def _seed(database_url: str, scope: str, ids: list[str]) -> None:
    url = make_url(database_url)
    conn = MySQLdb.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        passwd=url.password or "",
        db=url.database,
        autocommit=True,
    )
    try:
        payload = b"r" * PAYLOAD_BYTES
        conn.cursor().executemany(
            "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
            " VALUES (%s, %s, 1, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
            [(scope, object_id, payload) for object_id in ids],
        )
    finally:
        conn.close()


def _round_ids(n: int) -> tuple[list[str], list[str]]:
    """A round's ids, and those that exist (the rest are missing)."""
    ids = [f"r{n:04d}-{i:03d}" for i in range(IDS)]
    return ids, ids[: IDS - MISSING]


def _check(answers: list[Any], ids: list[str]) -> int:
    errors = 0
    for object_id, answer in zip(ids, answers, strict=True):
        missing = object_id.endswith(tuple(f"-{i:03d}" for i in range(IDS - MISSING, IDS)))
        if missing != isinstance(answer, NotFound) or (
            not missing and not isinstance(answer, Record)
        ):
            errors += 1
    return errors


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    url = _env.redis_url(args.redis_host, args.redis_port, args.redis_db)
    logdir = Path(tempfile.mkdtemp(prefix="dataservice-bench-read-many-"))
    settings = Settings(
        config_path=_env.REPO / "queues.yml",
        broker_url=url,
        result_backend_url=url,
        redis_url=url,
        database_url=args.database_url,
        callers_file=run_callers_file(logdir, _env.CALLER),
    )
    config = settings.load()
    environ = worker_environ(settings)
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
    )
    flush_redis(url)
    _env.reset_database(args.database_url, environ)
    machine = machine_info(url, args.database_url)
    worker = WorkerProcess(
        worker_argv(LaneName.INTERACTIVE), environ, logdir / "worker.log", "interactive"
    )
    worker.start()
    runs: list[dict[str, Way]] = []
    try:
        with Client(_env.CALLER, settings, config) as client:
            _seed(args.database_url, "probe", ["p"])
            _env.wait_ready(worker, lambda: client.read("probe", "p", timeout=0.5))
            assert worker.pid is not None
            for r in range(args.runs):
                scope = f"run{r}"
                ways = {way: Way() for way in WAYS}
                rounds = [_round_ids(n) for n in range(2 * args.rounds)]
                _seed(args.database_url, scope, [i for _, existing in rounds for i in existing])
                for n, (ids, _) in enumerate(rounds):
                    for object_id in ids[:CACHED]:
                        client.read(scope, object_id)  # fills the cache; not measured
                    way = WAYS[(n + n // 2) % 2]
                    before_worker = process_cpu_s(worker.pid) or 0.0
                    before_client = time.process_time()
                    started = time.perf_counter()
                    if way == SINGLES:
                        answers: list[Any] = []
                        for object_id in ids:
                            try:
                                answers.append(client.read(scope, object_id))
                            except DataServiceError as exc:
                                answers.append(exc)
                    else:
                        answers = list(client.read_many(scope, ids))
                    elapsed = time.perf_counter() - started
                    measured = ways[way]
                    measured.client_cpu_s += time.process_time() - before_client
                    measured.worker_cpu_s += (process_cpu_s(worker.pid) or 0.0) - before_worker
                    measured.records += IDS
                    measured.latencies_ms.append(elapsed * 1000)
                    measured.errors += _check(answers, ids)
                runs.append(ways)
                console.print(f"[dim]run {r + 1}/{args.runs} done[/dim]")
    finally:
        worker.stop()
        flush_redis(url)
        _env.drop_database(args.database_url)
    return _report(args, machine, runs)


def _report(args: argparse.Namespace, machine: dict[str, Any], runs: list[dict[str, Way]]) -> Any:
    per_run = []
    for ways in runs:
        single, many = ways[SINGLES], ways[MANY]
        per_run.append(
            {
                way: {
                    "worker_cpu_ms_per_record": round(w.per_record_ms(w.worker_cpu_s), 4),
                    "client_cpu_ms_per_record": round(w.per_record_ms(w.client_cpu_s), 4),
                    "p50_ms_per_100": round(statistics.median(w.latencies_ms), 2),
                    "errors": w.errors,
                }
                for way, w in ways.items()
            }
            | {
                "worker_cpu_ratio": round(single.worker_cpu_s / many.worker_cpu_s, 1)
                if many.worker_cpu_s
                else None,
                "client_cpu_ratio": round(single.client_cpu_s / many.client_cpu_s, 1)
                if many.client_cpu_s
                else None,
            }
        )
    ratios = [r["worker_cpu_ratio"] for r in per_run if r["worker_cpu_ratio"] is not None]
    return {
        "command": " ".join(["python", "bench/read_many.py", *sys.argv[1:]]),
        "machine": machine,
        "setup": {
            "rounds_per_way": args.rounds,
            "runs": args.runs,
            "ids": IDS,
            "cached": CACHED,
            "missing": MISSING,
            "payload_bytes": PAYLOAD_BYTES,
        },
        "runs": per_run,
        "target_worker_cpu_ratio": TARGET,
        "meets_target": bool(ratios) and min(ratios) >= TARGET,
    }


def print_report(console: Console, data: dict[str, Any]) -> None:
    m = data["machine"]
    console.print(_env.host_line(m, f"Redis {m['redis_server']}, MariaDB {m['mariadb']}"))
    table = Table(title="100 ids (60 cached, 35 not, 5 missing): single reads vs read_many")
    for column in ("run", "way", "worker CPU ms/record", "caller CPU ms/record", "p50 ms / 100"):
        table.add_column(column)
    for n, run in enumerate(data["runs"], 1):
        for way in WAYS:
            w = run[way]
            table.add_row(
                str(n),
                way,
                f"{w['worker_cpu_ms_per_record']:.3f}",
                f"{w['client_cpu_ms_per_record']:.3f}",
                f"{w['p50_ms_per_100']:.1f}",
            )
    console.print(table)
    met = "[green]met[/green]" if data["meets_target"] else "[red]missed[/red]"
    console.print(
        "worker CPU per record, single / read_many: "
        + ", ".join(f"{r['worker_cpu_ratio']}x" for r in data["runs"])
        + f" (target >= {data['target_worker_cpu_ratio']}x: {met}); caller: "
        + ", ".join(f"{r['client_cpu_ratio']}x" for r in data["runs"])
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=40, help="rounds of 100 ids per way and run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a small run that only checks it works")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--redis-host", default="127.0.0.1")
    p.add_argument("--redis-port", type=int, default=6379)
    p.add_argument("--redis-db", type=int, default=11, help="Redis db of its own, flushed")
    p.add_argument(
        "--database-url",
        default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_bench",
        help="the bench database (must end in _bench: it is dropped and recreated)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.runs = 3, 1
    if args.redis_db == 0:
        p.error("--redis-db must not be 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    data = run(args, console)
    print_report(console, data)
    if args.json:
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 1 if any(r[w]["errors"] for r in data["runs"] for w in WAYS) else 0


if __name__ == "__main__":
    raise SystemExit(main())

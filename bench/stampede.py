"""The cache stampede: many callers read the same cold keys at once, with
coalescing and, as the baseline, without it, in the same run.

    .venv/bin/python bench/stampede.py [--keys 50] [--readers 100] [--json out.json]

For each mode in turn (``--rounds`` rounds; the order of the two modes
alternates between rounds), ``--replicas`` interactive worker processes start
with the shipped ``queues.yml``, changed only in ``cache.coalesce``,
``changes.guard`` (off: no change consumer runs here) and, with
``--db-delay-ms``, ``database.injected_delay_ms``; each serves a read
before anything is measured. Then ``--keys`` records nobody has read (a fresh
scope per mode, so every key is cold) are read ``--readers`` times each,
``ALLOW_CACHED``, one attempt per read (client retries off), from
``--threads`` caller threads released together; thread ``n`` makes reads
``n``, ``n + threads``, ... of a list ordered key by key, so the first
``--threads`` reads are ``threads / readers`` keys with all their readers at
once (5 keys x 100 by default), and each key meets a stampede of its own.

Without ``--db-delay-ms`` a read takes about a millisecond on loopback, and the
fill lands before many more reads of its key arrive: the baseline then costs
little. The delay shows what the same stampede costs a slower database.

The database counts the reads itself: a MariaDB of the bench's own (a free
port, a temporary directory) logs every statement to ``mysql.general_log``,
and the replicas connect as a user nothing else uses
(:mod:`dataservice_tools.testkit.counting_database`).
Broker, results and cache share one Redis db (``--redis-db``; flushed before
and after each mode, never db 0).

Reported per mode: database reads per key (mean, max, total), each read's
latency as its caller saw it (p50, p99), and errors by kind.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from dataservice_tools.loadtest.environment import flush_redis, run_callers_file
from dataservice_tools.testkit.bursts import burst
from dataservice_tools.testkit.counting_database import CountingDatabase
from dataservice_tools.testkit.flood import one_attempt
from dataservice_tools.testkit.machine import machine_info
from dataservice_tools.testkit.replicas import replicas, until_each_answers
from dataservice_tools.testkit.series import percentile
from rich.console import Console
from rich.table import Table

from bench import _env
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings

PAYLOAD = bytes(range(256)) * 4
WARM = "warm"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--keys", type=int, default=50, help="cold keys read in each mode")
    p.add_argument("--readers", type=int, default=100, help="reads of each key")
    p.add_argument("--threads", type=int, default=500, help="caller threads")
    p.add_argument("--replicas", type=int, default=3, help="interactive worker processes")
    p.add_argument("--rounds", type=int, default=1, help="rounds of both modes")
    p.add_argument("--db-delay-ms", type=int, default=0, help="database.injected_delay_ms")
    p.add_argument("--timeout", type=float, default=30.0, help="each read's deadline (s)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server")
    p.add_argument("--redis-db", type=int, default=3, help="Redis db (flushed; never 0)")
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args(argv)
    if args.redis_db == 0:
        p.error("--redis-db must not be 0")
    if min(args.keys, args.readers, args.threads, args.replicas, args.rounds) <= 0:
        p.error("--keys, --readers, --threads, --replicas and --rounds must be positive")
    return args


def mode_settings(base: Settings, work: Path, coalesce: bool, delay_ms: int) -> Settings:
    data: dict[str, Any] = yaml.safe_load((_env.REPO / "queues.yml").read_text(encoding="utf-8"))
    data["cache"]["coalesce"] = coalesce
    data["database"]["injected_delay_ms"] = delay_ms
    # No change consumer runs here, and nothing but the bench changes records.
    data["changes"]["guard"] = False
    path = work / f"queues-coalesce-{str(coalesce).lower()}.yml"
    path.write_text(
        "# Written by bench/stampede.py for one run.\n" + yaml.safe_dump(data, sort_keys=False),
        encoding="utf-8",
    )
    return dataclasses.replace(base, config_path=path)


def measure(
    args: argparse.Namespace, settings: Settings, database: CountingDatabase, work: Path
) -> dict[str, Any]:
    """One mode: start the replicas, check each answers, then the stampede."""
    config = load_config(settings.config_path)
    client_config: Config = one_attempt(config)
    scope = f"stampede-{uuid.uuid4().hex[:10]}"
    keys = [f"k{n:03d}" for n in range(args.keys)]
    database.forget()
    database.seed(scope, [*keys, WARM], PAYLOAD)
    flush_redis(settings.redis_url)
    try:
        with replicas(settings, config, work, args.replicas) as fleet:
            until_each_answers(settings, client_config, fleet.workers, _env.CALLER, scope, WARM)
            reads = [key for key in keys for _ in range(args.readers)]
            began = time.monotonic()
            outcomes = burst(settings, client_config, _env.CALLER, scope, reads, args.threads,
                             args.timeout)  # fmt: skip
            wall_s = time.monotonic() - began
            fleet.check_alive()
    finally:
        flush_redis(settings.redis_url)
    per_key = [database.reads(scope, key) for key in keys]
    latencies = [o.latency_ms for o in outcomes]
    return {
        "coalesce": config.cache.coalesce,
        "reads": len(reads),
        "answered": len(outcomes),
        "ok": sum(o.record is not None for o in outcomes),
        "errors": dict(Counter(o.error for o in outcomes if o.error)),
        "database_reads": {
            "total": sum(per_key),
            "per_key_mean": round(sum(per_key) / len(per_key), 2),
            "per_key_min": min(per_key),
            "per_key_max": max(per_key),
        },
        "p50_ms": round(percentile(latencies, 50) or 0.0, 1),
        "p99_ms": round(percentile(latencies, 99) or 0.0, 1),
        "wall_s": round(wall_s, 2),
    }


def print_report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="stampede: cold keys read at once, coalescing on and off")
    columns = ("round", "coalesce", "ok/reads", "errors", "db reads/key mean",
               "max", "total", "p50 ms", "p99 ms", "wall s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for row in result["modes"]:
        db = row["database_reads"]
        table.add_row(
            str(row["round"]), str(row["coalesce"]).lower(), f"{row['ok']}/{row['reads']}",
            json.dumps(row["errors"]) if row["errors"] else "0", f"{db['per_key_mean']}",
            str(db["per_key_max"]), str(db["total"]), f"{row['p50_ms']}", f"{row['p99_ms']}",
            f"{row['wall_s']}",
        )  # fmt: skip
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    work = Path(tempfile.mkdtemp(prefix="dataservice-stampede-"))
    redis_url = f"{args.redis}/{args.redis_db}"
    shipped = load_config(_env.REPO / "queues.yml")
    modes: list[dict[str, Any]] = []
    with CountingDatabase(shipped.database) as database:
        base = database.on(
            Settings(
                broker_url=redis_url,
                result_backend_url=redis_url,
                redis_url=redis_url,
                callers_file=run_callers_file(work, _env.CALLER),
            )
        )
        machine = machine_info(redis_url, database.root_url)
        for round_ in range(1, args.rounds + 1):
            order = (True, False) if round_ % 2 else (False, True)
            for coalesce in order:
                settings = mode_settings(base, work, coalesce, args.db_delay_ms)
                console.print(f"[dim]round {round_}: coalesce {str(coalesce).lower()}[/dim]")
                row = measure(args, settings, database, work / f"r{round_}-{coalesce}")
                modes.append({"round": round_, **row})
    result = {
        "command": " ".join(["python", "bench/stampede.py", *sys.argv[1:]]),
        "machine": machine,
        "setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "modes": modes,
    }
    print_report(console, result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

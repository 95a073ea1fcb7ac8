"""What the attribution bench sets up besides its private redis-server: its
options, each system's configuration, the seeded records, the worker
processes, and where MariaDB's CPU is read from."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import create_engine, insert, text

from bench import _env
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, worker_argv, worker_environ
from dataservice.store.schema import records as records_table

# Rows per INSERT: well under max_allowed_packet once the driver escapes them.
SEED_BATCH_BYTES = 1 << 20
SIZES = (100, 1024, 8192, 65536)
DEFAULT_MIX = (40, 30, 20, 10)
DBS = {"a": 1, "b": 2, "c": 3}
WORKLOADS = ("cached", "database")


def parse_args(argv: list[str] | None, description: str | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.attribution",
        description=description,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--rate", type=float, default=100.0, help="offered requests/s per cell")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per cell")
    p.add_argument("--rounds", type=int, default=2, help="rounds the seconds are split into")
    p.add_argument("--warmup-seconds", type=float, default=1.0, help="open loop before each cell")
    p.add_argument("--records", type=int, default=100, help="records per payload size")
    p.add_argument("--captures", type=int, default=5, help="calls under MONITOR / tracemalloc")
    p.add_argument("--timeout", type=float, default=2.0, help="each call's deadline (s)")
    p.add_argument("--mix", default=",".join(map(str, DEFAULT_MIX)), help="%% per size")
    p.add_argument("--fixture-repeats", type=int, default=5)
    p.add_argument("--fixture-min-time", type=float, default=0.02, help="CPU s per sample")
    p.add_argument("--quick", action="store_true", help="a short run (for the test)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument(
        "--request-lines",
        choices=("all", "failures", "none"),
        default="failures",
        help="(c)'s logging.requests (failures: no line per answer, as (a) and (b) log none)",
    )
    p.add_argument(
        "--database-url",
        default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_attribution_bench",
        help="dropped and recreated (must end in _bench)",
    )
    p.add_argument("--keep", action="store_true", help="leave the database")
    args = p.parse_args(argv)
    if args.quick:
        args.rate, args.seconds, args.warmup_seconds, args.rounds = 100.0, 0.6, 0.2, 1
        args.records, args.captures = 20, 3
        args.fixture_repeats, args.fixture_min_time = 3, 0.005
    weights = [float(x) for x in args.mix.split(",")]
    if len(weights) != len(SIZES) or min(weights) < 0 or not sum(weights):
        p.error(f"--mix needs {len(SIZES)} non-negative shares")
    args.mix_weights = {s: w / sum(weights) for s, w in zip(SIZES, weights, strict=True)}
    if min(args.rate, args.seconds, args.rounds) <= 0 or not 1 <= args.captures <= args.records:
        p.error("need a positive rate, duration and rounds, and records >= captures >= 1")
    return args


def facts(args: argparse.Namespace) -> dict[str, Any]:
    """The run's set-up, as the report states it."""
    named = ("rate", "seconds", "rounds", "warmup_seconds", "records", "captures", "timeout")
    found = {name: getattr(args, name) for name in named}
    return {**found, "sizes": list(SIZES), "mix": args.mix_weights, "redis_dbs": DBS}


def write_config(directory: Path, name: str, fmt: str, request_lines: str) -> Path:
    """The shipped queues.yml reading (and filling) only ``fmt``, without a change
    consumer's guard: none runs here, and nothing but the bench writes records."""
    document = yaml.safe_load((_env.REPO / "queues.yml").read_text(encoding="utf-8"))
    document["changes"]["guard"] = False
    document["cache"]["rollout"].update({"fill": [fmt], "read": fmt, "percent": 100})
    document.setdefault("logging", {})["requests"] = request_lines
    path = directory / f"{name}.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def seed(url: str, scope: str, count: int, size: int) -> list[str]:
    """``count`` records of ``size`` random bytes in ``scope``; their ids."""
    ids = [f"obj-{n:06d}" for n in range(count)]
    batch = max(1, SEED_BATCH_BYTES // size)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            now = text("UTC_TIMESTAMP(6)")
            for start in range(0, count, batch):
                rows = [
                    {"scope": scope, "object_id": i, "revision": 1, "payload": os.urandom(size)}
                    for i in ids[start : start + batch]
                ]
                conn.execute(insert(records_table).values(created_at=now, updated_at=now), rows)
    finally:
        engine.dispose()
    return ids


def mariadb_pid(url: str) -> int | None:
    """The server's own process (several may run here), from its pid file."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            path = conn.execute(text("SELECT @@pid_file")).scalar()
        return int(Path(str(path)).read_text().split()[0])
    except (OSError, ValueError):
        return _env.find_pid("mariadbd", "mysqld")
    finally:
        engine.dispose()


def environ(settings: Settings | None) -> dict[str, str]:
    """A worker's environment: ``settings``, and this source tree on its path
    (the workers run the tree the bench runs, not an installed copy)."""
    found = worker_environ(settings)
    found["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
    )
    return found


def workers(
    plain_url: str, settings: dict[str, Settings], database_url: str, directory: Path
) -> dict[str, WorkerProcess]:
    """(a), (b) and (c)'s worker processes (not started)."""
    module = [sys.executable, "-m", "bench.attribution.app"]
    plain = ["plain", "--url", plain_url, "--database-url", database_url]
    plain += ["--config", str(_env.REPO / "queues.yml")]
    argvs = {
        "a": module + plain,
        "b": [*module, "json"],
        "c": worker_argv(LaneName.INTERACTIVE),
    }
    return {
        s: WorkerProcess(argv, environ(settings.get(s)), directory / f"worker-{s}.log", f"({s})")
        for s, argv in argvs.items()
    }

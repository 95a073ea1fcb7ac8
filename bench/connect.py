"""CPU per new Redis connection: redis-py's defaults against the service's.

    .venv/bin/python bench/connect.py [--redis-url redis://127.0.0.1:6379/0]
                                      [--connects 300] [--repeats 9] [--json out.json]

Every connection a process opens pays its handshake in that process's CPU, and
when a stalled or restarted Redis answers again every caller and worker thread
opens one at once. Two ways of opening a connection as a caller's Redis user
(the rules of :func:`dataservice.security.acl.caller_rules`, set up for the run under a
user name of the bench's own and removed after):

- **library default**: ``redis.ConnectionPool.from_url(url)``: for each
  connection redis-py reads its package metadata for the version it reports,
  sends it in two ``CLIENT SETINFO`` (which the caller's user is refused) and
  asks for ``CLIENT MAINT_NOTIFICATIONS`` (which a Redis before 8 refuses);
- **service**: the same with :data:`dataservice.redis.bounded.QUIET`, as the
  service makes its pools: ``HELLO`` and ``SELECT`` only.

Each sample takes ``--connects`` connections, each from a pool of its own
(connect and handshake), closes them, and takes the CPU time of this process
(``time.process_time_ns``) and the wall time; the two ways alternate in each
of ``--repeats`` rounds and the figures are the medians, per connect. The
ratio is the service's over the library default's, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from dataservice_tools.testkit.machine import host, version
from rich.console import Console
from rich.table import Table

from bench import _env
from dataservice.redis.bounded import QUIET
from dataservice.security.acl import caller_rules

BENCH_USER = "ds-bench-connect"
WAYS = ("library default", "service")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--connects", type=int, default=300, help="connections per sample")
    p.add_argument("--repeats", type=int, default=9, help="rounds")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if args.connects < 1 or args.repeats < 1:
        p.error("--connects and --repeats must be positive")
    return args


def sample(way: str, url: str, password: str, connects: int) -> tuple[float, float]:
    """CPU and wall ms per connect of ``connects`` connections opened ``way``."""
    options: dict[str, Any] = {"username": BENCH_USER, "password": password, "socket_timeout": 5}
    if way == "service":
        options.update(QUIET)
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(connects):
        # A pool of its own each time: what a connection costs is decided by
        # the pool that makes it (maintenance notifications are the pool's).
        pool = redis.ConnectionPool.from_url(url, **options)
        pool.release(pool.get_connection())
        pool.disconnect()
    cpu, wall = time.process_time_ns() - cpu, time.perf_counter_ns() - wall
    return cpu / connects / 1e6, wall / connects / 1e6


def run(args: argparse.Namespace) -> dict[str, Any]:
    machine = host()
    admin = redis.Redis.from_url(args.redis_url, socket_timeout=5)
    admin_info = admin.info("server")
    password = secrets.token_urlsafe(24)
    rules = caller_rules(("bench-connect",), "bench-connect")
    admin.execute_command("ACL", "SETUSER", BENCH_USER, "reset", "on", f">{password}", *rules)
    try:
        rounds: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        order = list(WAYS)
        for _ in range(args.repeats):
            for way in order:
                rounds[way].append(sample(way, args.redis_url, password, args.connects))
            order.reverse()
    finally:
        admin.execute_command("ACL", "DELUSER", BENCH_USER)
        admin.close()
    figures = {
        way: {
            "cpu_ms": round(statistics.median(c for c, _ in values), 3),
            "wall_ms": round(statistics.median(w for _, w in values), 3),
        }
        for way, values in rounds.items()
    }
    base, service = figures["library default"], figures["service"]
    return {
        "machine": {
            **machine,
            "redis-py": version("redis"),
            "redis_server": admin_info["redis_version"],
        },
        "connects_per_sample": args.connects,
        "repeats": args.repeats,
        "per_connect": figures,
        "service_over_default": {
            "cpu": round(service["cpu_ms"] / base["cpu_ms"], 3),
            "wall": round(service["wall_ms"] / base["wall_ms"], 3),
        },
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run(args)
    console = Console()
    m = report["machine"]
    console.print(_env.host_line(m, f"redis-py {m['redis-py']}, Redis {m['redis_server']}"))
    table = Table(title="one new Redis connection as a caller's user (median of rounds)")
    for column in ("connection", "CPU ms", "wall ms"):
        table.add_column(column, justify="left" if column == "connection" else "right")
    for way, figures in report["per_connect"].items():
        table.add_row(way, f"{figures['cpu_ms']:.3f}", f"{figures['wall_ms']:.3f}")
    ratio = report["service_over_default"]
    table.add_row("service / default", f"{ratio['cpu']:.3f}", f"{ratio['wall']:.3f}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

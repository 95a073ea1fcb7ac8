"""Two callers over three worker replicas: one floods at ten times its rate.

    .venv/bin/python bench/flood.py [--seconds 30] [--json out.json]

Acceptance: the flooding caller's accepted rate is within 10 % of its
configured rate, and the other caller's p99 stays within 1.2x of its p99 alone.

Sets everything up itself: a ``queues.yml`` derived from the shipped one with
two more callers (``flooder``: ``--flooder-rate``/s, burst ``--flooder-burst``;
``steady``: limits it never reaches), a callers file with a key for each (mode
600), a fresh Redis db (``--redis-db``; never db 0) and bench database, a few
seeded 1 KB records, and ``--replicas`` interactive worker processes
(``python -m dataservice.cli worker --lane interactive``). Then

- warm-up: ``steady`` alone, unmeasured;
- phase A: ``steady`` alone, open-loop reads at ``--steady-rate``/s;
- phase B: the same, while ``flooder`` sends open-loop reads at
  ``--factor`` x its rate from ``--flood-processes`` processes of their own
  (so the flood's client CPU does not share the steady caller's GIL; it does
  share the machine's CPUs with the workers, which in production it would not).

Both callers' clients make one attempt per request (``client.retry.max_attempts``
1), so every refusal is seen and counted once. The flooder's bucket is full
when phase B starts, so it may take ``burst`` requests above its rate: the
accepted rate is ``(ok - burst) / span``, span being the time from its first
to its last request sent. Workers are stopped on any exit. The callers, the
flood processes and the phases are :mod:`dataservice_tools.testkit.flood`
(``tests/scenarios/test_flood.py`` runs them too, shorter).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from dataservice_tools.loadtest.environment import flush_redis, run_callers_file, seed_records
from dataservice_tools.testkit.flood import (
    FLOODER,
    SCOPE,
    STEADY,
    Flooders,
    Phase,
    one_attempt,
    run_phase,
    write_config,
)
from dataservice_tools.testkit.machine import machine_info
from dataservice_tools.testkit.openloop import summarize_flood, summarize_steady
from dataservice_tools.testkit.replicas import Replicas
from rich.console import Console
from rich.table import Table

from bench import _env
from dataservice.client import Client
from dataservice.config.settings import Settings
from dataservice.store.migrate import upgrade

PAYLOAD_BYTES = 1024
TARGET_RATE_TOLERANCE = 0.10
TARGET_P99_RATIO = 1.2
CPU_PARTS = ("bench", "flood_clients", "workers", "redis", "mariadb")


# The bench -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    p.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds before phase A")
    p.add_argument("--replicas", type=int, default=3, help="interactive worker processes")
    p.add_argument("--steady-rate", type=float, default=20.0, help="steady caller, requests/s")
    p.add_argument("--flooder-rate", type=float, default=40.0, help="flooder's rate_per_s")
    p.add_argument("--flooder-burst", type=int, default=10, help="flooder's burst")
    p.add_argument("--factor", type=float, default=10.0, help="flood offered / flooder's rate")
    p.add_argument("--flood-processes", type=int, default=2, help="processes sending the flood")
    p.add_argument("--flood-threads", type=int, default=32, help="caller threads per process")
    p.add_argument("--records", type=int, default=100, help="seeded 1 KB records")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server")
    p.add_argument("--redis-db", type=int, default=4, help="Redis db (flushed; never 0)")
    p.add_argument(
        "--database-url",
        default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_flood_bench",
        help="the bench database (must end in _bench: it is dropped and recreated)",
    )
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args(argv)
    if args.redis_db == 0:
        p.error("--redis-db must not be 0")
    if min(args.seconds, args.steady_rate, args.flooder_rate, args.factor) <= 0:
        p.error("--seconds, rates and --factor must be positive")
    return args


def report(args: argparse.Namespace, alone: Phase, flooded: Phase, burst: int) -> dict[str, Any]:
    steady_a = summarize_steady(alone.steady)
    steady_b = summarize_steady(flooded.steady)
    flood = summarize_flood(flooded.flood, args.flooder_rate, burst)
    ratio = (
        steady_b["p99_ms"] / steady_a["p99_ms"]
        if steady_a["p99_ms"] and steady_b["p99_ms"]
        else None
    )
    return {
        "phases": {
            "alone": {"steady": steady_a, "cpu_s": alone.cpu_s},
            "flooded": {"steady": steady_b, "flooder": flood, "cpu_s": flooded.cpu_s},
        },
        "verdicts": {
            "flooder_accepted_over_rate": flood["accepted_over_rate"],
            "flooder_rate_within_10_percent": flood["accepted_over_rate"] is not None
            and abs(flood["accepted_over_rate"] - 1) <= TARGET_RATE_TOLERANCE,
            "steady_p99_ratio": None if ratio is None else round(ratio, 3),
            "steady_p99_within_1_2x": ratio is not None and ratio <= TARGET_P99_RATIO,
            "steady_refused": steady_a["exhausted"] + steady_b["exhausted"],
        },
    }


def print_report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="flood: steady caller alone, then beside a flooder at 10x its rate")
    for column in ("phase", "caller", "sent/s", "ok", "refused", "other", "p50 ms", "p99 ms"):
        table.add_column(column, justify="left" if column in ("phase", "caller") else "right")
    for phase, body in result["phases"].items():
        for caller in (STEADY, FLOODER):
            s = body.get(caller)
            if s is None:
                continue
            table.add_row(
                phase, caller, f"{s['sent_per_s']:.1f}", str(s["ok"]), str(s["exhausted"]),
                str(s["other"]), f"{s['p50_ms']}", f"{s['p99_ms']}",
            )  # fmt: skip
    console.print(table)
    f = result["phases"]["flooded"]["flooder"]
    v = result["verdicts"]
    console.print(
        f"flooder: {f['ok']} accepted in {f['span_s']:.2f} s -> "
        f"{f['accepted_per_s']:.2f}/s after its burst of {f['burst']} "
        f"({v['flooder_accepted_over_rate']:.3f} of {f['rate_per_s']}/s; "
        f"within 10 %: {v['flooder_rate_within_10_percent']})\n"
        f"steady p99 flooded / alone: {v['steady_p99_ratio']} "
        f"(within 1.2x: {v['steady_p99_within_1_2x']}); steady refusals: {v['steady_refused']}\n"
        f"CPU s (alone / flooded): "
        + ", ".join(
            f"{part} {result['phases']['alone']['cpu_s'].get(part)} / "
            f"{result['phases']['flooded']['cpu_s'].get(part)}"
            for part in CPU_PARTS
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    work = Path(tempfile.mkdtemp(prefix="dataservice-flood-"))
    redis_url = f"{args.redis}/{args.redis_db}"
    shipped = yaml.safe_load((_env.REPO / "queues.yml").read_text(encoding="utf-8"))
    config = write_config(shipped, work / "queues.yml", args.flooder_rate, args.flooder_burst)
    settings = Settings(
        config_path=work / "queues.yml",
        broker_url=redis_url,
        result_backend_url=redis_url,
        redis_url=redis_url,
        database_url=args.database_url,
        callers_file=run_callers_file(work, FLOODER, STEADY),
    )
    client_config = one_attempt(config)
    replicas = Replicas(settings, config, args.replicas, work)
    flooders: Flooders | None = None
    steady: list[Client] = []
    try:
        flush_redis(redis_url)
        _env.drop_database(args.database_url)
        upgrade(args.database_url, config.database)
        ids = seed_records(args.database_url, SCOPE, args.records, PAYLOAD_BYTES)
        machine = machine_info(redis_url, args.database_url)
        with console.status(f"starting {args.replicas} replicas and the flood processes"):
            ready_s = replicas.start()
            flooders = Flooders(
                settings, client_config, FLOODER, SCOPE, args.flooder_rate * args.factor,
                args.flood_processes, args.flood_threads,
            )  # fmt: skip
        steady = [Client(STEADY, settings, client_config) for _ in range(2)]
        pids = {
            "bench": [os.getpid()],
            "flood_clients": flooders.pids(),
            "workers": replicas.pids(),
            "redis": [pid] if (pid := _env.find_pid("redis-server")) else [],
            "mariadb": [pid] if (pid := _env.find_pid("mariadbd", "mysqld")) else [],
        }
        console.print(f"[dim]warm-up {args.warmup:.0f} s[/dim]")
        run_phase(steady, SCOPE, ids, args.steady_rate, args.warmup, None, pids)
        console.print(f"[dim]phase A: steady alone, {args.seconds:.0f} s[/dim]")
        alone = run_phase(steady, SCOPE, ids, args.steady_rate, args.seconds, None, pids)
        # The flooder's bucket has been full since the start: phase B begins with its burst.
        console.print(f"[dim]phase B: steady + flood, {args.seconds:.0f} s[/dim]")
        flooded = run_phase(steady, SCOPE, ids, args.steady_rate, args.seconds, flooders, pids)
        replicas.check_alive()
    finally:
        for client in steady:
            client.close()
        if flooders is not None:
            flooders.close()
        replicas.stop()
        flush_redis(redis_url)
        _env.drop_database(args.database_url)
    result = {
        "command": " ".join(["python", "bench/flood.py", *sys.argv[1:]]),
        "machine": machine,
        "setup": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "flood_offered_per_s": args.flooder_rate * args.factor,
            "replicas_ready_s": round(ready_s, 1),
            "client_attempts": 1,
            "work_dir": str(work),
        },
        **report(args, alone, flooded, args.flooder_burst),
    }
    print_report(console, result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

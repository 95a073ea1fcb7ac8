"""Interactive read round trip against its peers: a stock Celery no-op, a stock
Dramatiq no-op and the floor of a request and its answer over Redis, same
machine, same concurrency.

    .venv/bin/python -m bench.roundtrip [--read cached|primary] [--callers 16]
        [--systems service,celery,dramatiq,floor] [--json out.json]

``--read cached`` (the default) reads ``ALLOW_CACHED`` after every seeded
record has been read once, so every measured read is a cache hit; ``--read
primary`` reads ``PRIMARY``, the database under a permit.

Sets everything up itself: flushes its own Redis db numbers, one per system
(``--service-db``, ``--celery-db``, ``--dramatiq-db``, ``--floor-db``; never db
0), recreates the ``dataservice_bench`` database with ``dataservice db upgrade``
and seeds it with 1 KB records, starts as subprocesses ``dataservice worker
--lane interactive`` and each peer's worker with the lane's concurrency as its
threads (a stock Celery worker, :mod:`bench.baselines.noop`, with the lane's
worker options too; ``dramatiq --processes 1 --threads N``,
:mod:`bench.baselines.dramatiq_noop`; the floor's, :mod:`bench.baselines.floor`),
waits until each answers, warms up, then measures

1. one caller, sequential requests;
2. ``--callers`` threads, each with its own ``Client`` (and stock Celery app,
   Dramatiq broker, Redis client), issuing requests back to back
   (``--shared-client``: one of each for all).

The systems take turns in rounds whose order rotates by one each round (A B C D,
B C D A, ...; with two systems A B, B A), so drift on a noisy machine hits all
alike. Latency is the caller's wall time per call (``client.read(...)`` against
``noop.delay().get()``, ``actor.send().get_result(block=True)`` and the floor's
push and pop); throughput in the concurrent phase counts completions while every
caller is still busy. The CPU each process used per request (client = this
process, worker, redis-server, mariadbd, and with ``--broker amqp`` RabbitMQ's
Erlang VM) is read from ``/proc``. The report gives the service / peer ratios and
each target of ``--read`` (:data:`bench.roundtrip.systems.TARGETS`), met or
missed. Subprocesses are stopped on any exit.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from bench._env import sigterm_as_exit
from bench.roundtrip.systems import CPU_COMPONENTS, Bench, parse_args


def main(argv: list[str] | None = None) -> int:
    bench = Bench.create(parse_args(argv, __doc__))
    with sigterm_as_exit():
        try:
            bench.setup()
            report = bench.report(bench.measure())
        except KeyboardInterrupt:
            bench.console.print("[red]interrupted[/red]")
            return 130
        finally:
            bench.cleanup()
    _print_report(bench.console, report)
    if bench.args.json:
        bench.args.json.write_text(json.dumps(report, indent=2) + "\n")
        bench.console.print(f"wrote {bench.args.json}")
    return 0


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print_report(console: Console, report: dict[str, Any]) -> None:
    m = report["machine"]
    console.print(
        f"[bold]machine[/bold]: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), "
        f"Linux {m['kernel']}, load {m['loadavg_at_start']}\n"
        f"Python {m['python']}, celery {m['celery']}, kombu {m['kombu']}, "
        f"dramatiq {m.get('dramatiq', '-')}, "
        f"redis-py {m['redis_py']} (hiredis {m['hiredis']}), SQLAlchemy {m['sqlalchemy']}, "
        f"mysqlclient {m['mysqlclient']}, protobuf {m['protobuf']}\n"
        f"Redis {m['redis_server']}, MariaDB {m['mariadb']}"
    )
    s = report["setup"]
    console.print(
        f"[bold]setup[/bold]: {s['read']} reads; "
        f"threads pool -c{s['worker']['concurrency']}, prefetch 1, acks_late, no gossip/mingle; "
        f"{s['rounds']} rounds, the order rotating; "
        f"{s['requests_per_system_and_phase']} requests per system and phase; "
        f"{'one client per caller' if s['client_per_caller'] else 'one shared client'}"
    )
    table = Table(title="round trip: service read and its peers")
    for column in ("phase", "system", "n", "err", "p50 ms", "p95 ms", "p99 ms", "mean ms"):
        table.add_column(column, justify="right" if column not in ("phase", "system") else "left")
    table.add_column("req/s", justify="right")
    for part in CPU_COMPONENTS:
        table.add_column(f"CPU {part}\nms/req", justify="right")
    for phase, by_system in report["results"].items():
        for system, r in by_system.items():
            cpu = r["cpu_ms_per_request"]
            table.add_row(
                phase,
                system,
                str(r["requests"]),
                str(r["errors"]),
                _fmt(r["p50_ms"]),
                _fmt(r["p95_ms"]),
                _fmt(r["p99_ms"]),
                _fmt(r["mean_ms"]),
                _fmt(r["throughput_per_s"], 0),
                *(_fmt(cpu[part]) for part in CPU_COMPONENTS),
            )
        table.add_section()
    console.print(table)
    for phase, by_system in report["results"].items():
        for system, r in by_system.items():
            if r["errors"]:
                console.print(
                    f"[red]{phase}, {system}: {r['errors']} failed calls "
                    f"(first: {r['first_error']})[/red]"
                )
    ratios = Table(title="service / peer")
    for column in ("peer", "phase", "p50", "p50 per round: median (range)", "p99", "throughput"):
        ratios.add_column(column)
    for peer, by_phase in report["peer_ratios"].items():
        for phase, r in by_phase.items():
            ratios.add_row(
                peer,
                phase,
                f"{r['p50']:.2f}x",
                f"{r['p50_rounds_median']:.2f}x "
                f"({r['p50_rounds_min']:.2f}-{r['p50_rounds_max']:.2f})",
                f"{r['p99']:.2f}x",
                f"{r['throughput']:.2f}x",
            )
        ratios.add_section()
    console.print(ratios)
    targets = Table(title=f"targets, {s['read']} reads: service / peer")
    for column in ("peer", "phase", "target", "ratio", "met or missed"):
        targets.add_column(column)
    for t in report["targets"]:
        met = "[green]met[/green]" if t["met"] else "[red]missed[/red]"
        targets.add_row(t["peer"], t["phase"], t["target"], f"{t['value']:.2f}x", met)
    console.print(targets)
    console.print(f"[dim]elapsed {s['elapsed_s']} s[/dim]")


if __name__ == "__main__":
    sys.exit(main())

"""What one request costs: Redis commands, round trips to Redis per process, and
CPU, per request kind.

    .venv/bin/python -m bench.cost [--requests 2000] [--callers 16] [--json out.json]

Sets everything up itself: a redis-server of its own on a free port (Redis
counts per server, not per db; ``--redis-port``: one already running, which
others may use too), its db ``--redis-db`` (13; never db 0) flushed, the
``dataservice_cost_bench`` database recreated with ``dataservice db upgrade``
and seeded with 1 KB records, the shipped ``queues.yml`` as the
benches run it (the freshness guard off, so cached reads hit), and ``dataservice
worker --lane interactive`` and ``--lane batch`` as subprocesses, stopped on
any exit. Every record is read once, so each cached read measured is a hit.

The kinds (:mod:`bench.cost.kinds`), each through the public ``Client``:
``read`` (``ALLOW_CACHED``, a hit), ``read`` with ``PRIMARY``, ``read_many`` of
``--batch`` ids (all cached; per id), ``write`` of a new 1 KB record, and
``submit_many`` of ``--batch`` such writes, then their answers (per
operation). Each kind runs about ``--requests`` requests from one caller
(sequential), then from ``--callers`` threads, each with its own client.

Per request, each measured interval is followed by as long with nothing
asked; what that idle interval cost (the workers' and the clients' blocking
reads timing out, the workers' periodic work) is taken off (``idle_per_s``
in the JSON says how much it is). While requests flow the workers' blocking
reads return rather than time out, so the idle share taken off is a little
more than what would have run; a few commands a second against thousands of
requests.

- **Redis commands**: ``INFO commandstats`` before and after, by command. It
  counts the commands a script calls under their own names beside the
  script's ``EVALSHA``: checked on each run with an ``EVAL`` that calls ``SET``,
  ``GET`` twice and ``INCR`` (``checks.script_calls`` in the JSON; on Redis
  7.0.15: ``eval`` 1, ``set`` 1, ``get`` 2, ``incr`` 1). Which of a kind's
  commands a process sent (top-level: ``EVALSHA``, the blocking pops,
  pipelines' commands) and which a script called is read from ``MONITOR`` over
  ``--sample`` requests apart (:mod:`bench.cost.origins`); each command's
  count is shared among its origins as that sample shares it.
- **Round trips to Redis, per process**: the data segments each process's
  sockets to the Redis port sent (``ss -tinp``, ``data_segs_out``), before and
  after. Checked on each run (``checks`` in the JSON): 50 ``GET`` one after
  another add 50 segments, a pipeline of 50 ``GET`` adds 1 (so on Redis
  7.0.15 over loopback). A send longer than the socket's MSS (32 to 64 KB on
  loopback) is several segments: of the kinds, only ``submit_many``'s publish
  of 100 writes of 1 KB is, so its segments are a little more than its round
  trips (``bytes_sent`` in the JSON says how much each side sent).
- **CPU**: Redis's from ``INFO cpu`` (``used_cpu_user`` + ``used_cpu_sys``),
  this process's (the callers) from ``time.process_time``, the workers' and
  mariadbd's from ``/proc`` (10 ms ticks).

MariaDB's CPU is the server's, whoever else uses it; so are Redis's counters
with ``--redis-port`` (segments from another process show as the ``other``
side, and are reported).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from bench._env import host_line, sigterm_as_exit
from bench.cost.meters import BATCH, CALLER, INTERACTIVE, OTHER
from bench.cost.origins import SCRIPT
from bench.cost.runner import SEQUENTIAL, Bench, parse_args

WORKERS = (INTERACTIVE, BATCH)


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
    print_report(bench.console, report)
    if bench.args.json:
        bench.args.json.write_text(json.dumps(report, indent=2) + "\n")
        bench.console.print(f"wrote {bench.args.json}")
    failed = any(r["errors"] for kinds in report["phases"].values() for r in kinds.values())
    return 1 if failed else 0


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_report(console: Console, report: dict[str, Any]) -> None:
    m = report["machine"]
    console.print(host_line(m, f"Redis {m['redis_server']}, MariaDB {m['mariadb']}"))
    s, c = report["setup"], report["checks"]
    console.print(
        f"[bold]setup[/bold]: about {s['requests_per_kind_and_phase']} requests per kind and "
        f"phase; batches of {s['batch']}; {s['callers']} callers in the concurrent phase; "
        f"{s['records']} records of {s['payload_bytes']} B"
    )
    console.print(
        f"[bold]checks[/bold]: commands a script calls counted: {c['script_calls_counted']} "
        f"({c['script_calls']}); {c['commands']} GETs sent alone: {c['segments_sent_alone']} "
        f"segments, pipelined: {c['segments_pipelined']}"
    )
    table = Table(title="per request, net of as long idle")
    columns = (
        "phase",
        "kind",
        "n",
        "err",
        "p50 ms/call",
        "Redis cmds",
        "segments caller",
        "segments workers",
        "CPU ms Redis",
        "CPU ms caller",
        "CPU ms workers",
        "CPU ms mariadb",
    )
    for column in columns:
        left = column in ("phase", "kind")
        table.add_column(column, justify="left" if left else "right", no_wrap=left)
    for phase, kinds in report["phases"].items():
        for kind, r in kinds.items():
            cpu = r["cpu_ms"]
            workers_cpu = [cpu[w] for w in WORKERS]
            table.add_row(
                phase,
                kind,
                str(r["requests"]),
                str(r["errors"]),
                _f(r["p50_ms_per_call"]),
                _f(r["commands"], 1),
                _f(r["segments"][CALLER]),
                _f(sum(r["segments"][w] for w in WORKERS)),
                _f(cpu["redis"], 3),
                _f(cpu[CALLER], 3),
                _f(None if None in workers_cpu else sum(workers_cpu), 3),
                _f(cpu["mariadb"], 3),
            )
        table.add_section()
    console.print(table)
    _print_names(console, report["phases"][SEQUENTIAL])
    _print_idle(console, report["idle_per_s"])
    t = report["target"]
    met = "[green]met[/green]" if t["met"] else "[red]missed[/red]"
    console.print(
        f"{t['kind']}: Redis commands "
        + ", ".join(f"{v:.1f} ({p})" for p, v in t["commands"].items())
        + f" (target <= {t['commands_at_most']:.0f}); Redis CPU "
        + ", ".join(f"{_f(v, 3)} ms ({p})" for p, v in t["redis_cpu_ms"].items())
        + f" (target <= {t['redis_cpu_ms_at_most']} ms): {met}"
    )
    for phase, kinds in report["phases"].items():
        for kind, r in kinds.items():
            if r["errors"]:
                console.print(
                    f"[red]{phase}, {kind}: {r['errors']} failed ({r['first_error']})[/red]"
                )
            if r["refused_and_made_again"]:
                console.print(
                    f"[yellow]{phase}, {kind}: {r['refused_and_made_again']} calls refused by"
                    " admission and made again (their cost is counted)[/yellow]"
                )
    if report["idle_per_s"]["other_side_segments"] or any(
        r["segments"][OTHER] for kinds in report["phases"].values() for r in kinds.values()
    ):
        console.print(
            "[yellow]another process used this Redis meanwhile:"
            " its commands are counted too[/yellow]"
        )
    console.print(f"[dim]elapsed {report['setup']['elapsed_s']} s[/dim]")


def _print_names(console: Console, kinds: dict[str, Any]) -> None:
    table = Table(title="Redis commands per request by name, sequential (origin from MONITOR)")
    for column in ("kind", "command", "per request", "caller", "workers", "in scripts", "unseen"):
        table.add_column(column, justify="left" if column in ("kind", "command") else "right")
    for kind, r in kinds.items():
        for name, count in sorted(r["commands_by_name"].items(), key=lambda item: -item[1]):
            origin = r["commands_by_origin"][name]
            table.add_row(
                kind,
                name,
                _f(count, 3),
                _f(origin.get(CALLER), 3),
                _f(sum(origin.get(w, 0) for w in WORKERS) or None, 3),
                _f(origin.get(SCRIPT), 3),
                _f(origin.get("unseen"), 3),
            )
        table.add_section()
    console.print(table)


def _print_idle(console: Console, idle: dict[str, Any]) -> None:
    console.print(
        f"[bold]idle[/bold], per second over {idle['seconds']} s: "
        f"{idle['commands_total']} commands ("
        + ", ".join(f"{k} {v}" for k, v in idle["commands"].items())
        + "); segments "
        + ", ".join(f"{k} {v}" for k, v in idle["segments"].items())
        + "; CPU ms "
        + ", ".join(f"{k} {v}" for k, v in idle["cpu_ms"].items())
    )


if __name__ == "__main__":
    sys.exit(main())

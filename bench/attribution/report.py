"""The attribution bench's console report: the tables of ``python -m bench.attribution``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from bench.attribution.fixtures import STEPS
from bench.attribution.summary import SYSTEMS, WORKLOADS

NAMES = {
    "a": "(a) plain Celery, JSON",
    "b": "(b) admitted JSON",
    "c": "(c) service, protobuf",
}
CPU_COLUMNS = ("caller", "worker", "redis", "mariadb", "total")
IO_COLUMNS = ("request B", "body B", "response B", "Redis in B/op", "Redis out B/op", "cmds/op",
              "caller alloc KB", "worker RSS MB")  # fmt: skip
CREDIT_COLUMNS = ("(a)", "(b)", "(c)", "(a)->(b)", "(b)->(c)", "(b)->(c) caller+worker",
                  "of which serialization", "of which the rest", "(b)->(c) redis",
                  "p50 a / b / c ms")  # fmt: skip
WORKLOAD_TITLES = {
    "cached": "cached reads (every measured read a hit)",
    "database": "database reads (PRIMARY: no cache)",
}


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _size(value: int | str) -> str:
    if value == "mix":
        return "mix"
    size = int(value)
    return f"{size // 1024} KB" if size >= 1024 else f"{size} B"


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in ("size", "system") else "right")
    return table


def _cells(report: dict[str, Any], workload: str) -> list[dict[str, Any]]:
    """The workload's cells by size (the mix last), then system."""
    sizes = report["setup"]["sizes"]
    rows = [c for c in report["cells"] + report["mix"] if c["workload"] == workload]
    return sorted(
        rows,
        key=lambda r: (
            sizes.index(r["payload_bytes"]) if r["payload_bytes"] in sizes else len(sizes),
            r["system"],
        ),
    )


def print_header(console: Console, report: dict[str, Any]) -> None:
    m, s = report["machine"], report["setup"]
    console.print(
        f"[bold]machine[/bold]: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), "
        f"Linux {m['kernel']}, load {m['loadavg_at_start']}; Python {m['python']}, "
        f"celery {m['celery']}, redis-py {m['redis_py']}, protobuf {m['protobuf']}, "
        f"Redis {m['redis_server']} (private), MariaDB {m['mariadb']}"
    )
    mix = ", ".join(f"{_size(k)} {w:.0%}" for k, w in s["mix"].items())
    console.print(
        f"[bold]load[/bold]: open loop at {s['rate']:g}/s for {s['seconds']:g} s per cell "
        f"in {s['rounds']} rounds alternating the systems (after {s['warmup_seconds']:g} s "
        "of warm-up); "
        f"payloads {', '.join(_size(x) for x in s['sizes'])} (random bytes), mix {mix}; "
        f"{s['records']} records per size; worker threads -c{s['concurrency']}; "
        f"redis-server idle: {_f(s['redis_idle_ms_per_s'])} ms CPU/s"
    )
    console.print(
        "[dim]CPU per operation at a low rate includes each process waking up for each "
        "request: compare systems within a run, not with closed-loop benches.[/dim]"
    )


def print_cells(console: Console, report: dict[str, Any]) -> None:
    for workload in WORKLOADS:
        rows = _cells(report, workload)
        if not rows:
            continue
        cpu = _table(
            f"{WORKLOAD_TITLES[workload]}: latency and CPU ms per completed operation",
            ["size", "system", "ok", "err", "p50 ms", "p99 ms", *CPU_COLUMNS],
        )
        io = _table(
            f"{WORKLOAD_TITLES[workload]}: bytes and memory",
            ["size", "system", *IO_COLUMNS],
        )
        for i, row in enumerate(rows):
            last = i + 1 == len(rows) or rows[i + 1]["payload_bytes"] != row["payload_bytes"]
            c = row["cpu_ms_per_op"]
            name, size = NAMES[row["system"]], _size(row["payload_bytes"])
            cpu.add_row(
                size,
                name,
                str(row["ok"]),
                str(row["errors"]),
                _f(row["p50_ms"]),
                _f(row["p99_ms"]),
                *(_f(c[part], 3) for part in CPU_COLUMNS),
                end_section=last,
            )
            alloc = row["caller_allocated_bytes"]
            io.add_row(
                size,
                name,
                _f(row["request_message_bytes"], 0),
                _f(row["request_body_bytes"], 0),
                _f(row["response_bytes"], 0),
                _f(row["redis_in_bytes_per_op"], 0),
                _f(row["redis_out_bytes_per_op"], 0),
                _f(row["redis_commands_per_op"], 1),
                _f(None if alloc is None else alloc / 1024, 1),
                _f(row["worker_rss_mb"], 1),
                end_section=last,
            )
        console.print(cpu)
        console.print(io)
        for row in rows:
            if row.get("first_error"):
                console.print(
                    f"[red]{workload} {_size(row['payload_bytes'])} {NAMES[row['system']]}: "
                    f"{row['errors']} failed (first: {row['first_error']})[/red]"
                )


def print_credit(console: Console, report: dict[str, Any]) -> None:
    table = _table(
        "credit: total CPU ms per operation, and what each change moved it by (negative: saved)",
        ["workload", "size", *CREDIT_COLUMNS],
    )
    for row in report["credit"]:
        total, p50 = row["total_ms"], row["p50_ms"]
        table.add_row(
            row["workload"],
            _size(row["payload_bytes"]),
            *(_f(total[s], 3) for s in SYSTEMS),
            _f(row["a_to_b_ms"], 3),
            _f(row["b_to_c_ms"], 3),
            _f(row["b_to_c_caller_worker_ms"], 3),
            _f(row["b_to_c_serialization_ms"], 3),
            _f(row["b_to_c_rest_ms"], 3),
            _f(row["b_to_c_redis_ms"], 3),
            " / ".join(_f(p50.get(s)) for s in SYSTEMS),
            end_section=row["payload_bytes"] == "mix",
        )
    console.print(table)


def print_fixtures(console: Console, report: dict[str, Any]) -> None:
    table = _table(
        "serialization fixtures (no I/O): CPU µs per operation; bytes out; tracemalloc peak KB",
        ["size", "system", *STEPS, "request B", "response B", "peak KB (resp. decode)"],
    )
    rows = report["fixtures"]
    for i, row in enumerate(rows):
        steps = row["steps"]
        last = i + 1 == len(rows) or rows[i + 1]["payload_bytes"] != row["payload_bytes"]
        table.add_row(
            _size(row["payload_bytes"]),
            NAMES[row["system"]],
            *(_f(steps[name]["cpu_us"]) for name in STEPS),
            str(steps["request encode"]["output_bytes"]),
            str(steps["response encode"]["output_bytes"]),
            _f(steps["response decode"]["allocated_bytes"] / 1024, 1),
            end_section=last,
        )
    console.print(table)


def print_compression(console: Console, report: dict[str, Any]) -> None:
    table = _table(
        "compression (zlib), separately: CPU µs and bytes",
        ["payload", "bytes", "level", "compressed", "ratio", "compress µs", "decompress µs"],
    )
    for row in report["compression"]:
        table.add_row(
            row["payload"],
            f"{row['payload_bytes']:,}",
            str(row["level"]),
            f"{row['compressed_bytes']:,}",
            f"{row['payload_bytes'] / row['compressed_bytes']:.2f}x",
            _f(row["compress_us"], 1),
            _f(row["decompress_us"], 1),
        )
    console.print(table)
    for sentence in report["compression_verdicts"]:
        console.print(f"- {sentence}")


def print_report(console: Console, report: dict[str, Any]) -> None:
    print_header(console, report)
    print_cells(console, report)
    print_credit(console, report)
    print_fixtures(console, report)
    print_compression(console, report)
    console.print(f"[dim]elapsed {report['setup']['elapsed_s']} s[/dim]")

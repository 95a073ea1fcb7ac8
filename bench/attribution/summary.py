"""Figures drawn from the attribution bench's measurements: the weighted mix
of payload sizes, the credit of each change, and where compression pays.

**Mix.** Per-operation figures (CPU, bytes) of the mix are the per-size
figures weighted by the stated share of each size; its latency percentiles
are those of every measured call, each weighted by its size's share over the
calls measured at that size.

**Credit.** Each change is the later system's CPU less the earlier's
(negative: saved). (a) -> (b) is what the service's path adds or saves with
JSON kept: admission, permits, answers on result lists, hits on the consumer
thread, prepared messages. (b) -> (c) is the binary path, and with it what
(c) does that (b) does not: request signatures, the gate's per-caller limits,
and on a hit ``hit.lua``, which splices the v2 entry into the answer inside
Redis (a (c) hit runs no cache decode and no response encode in Python).
Of (b) -> (c) in the caller and the worker, the serialization fixtures
account for the difference of the steps each path runs per read; the rest
is those other differences, and noise.
"""

from __future__ import annotations

from typing import Any

SYSTEMS = ("a", "b", "c")
WORKLOADS = ("cached", "database")
# The serialization steps each path runs per read (bench/attribution/fixtures.py).
PATH_STEPS = {
    ("b", "cached"): (
        "request encode",
        "request decode",
        "cache decode",
        "response encode",
        "response decode",
    ),
    ("c", "cached"): ("request encode", "request decode", "response decode"),
    ("b", "database"): ("request encode", "request decode", "response encode", "response decode"),
    ("c", "database"): ("request encode", "request decode", "response encode", "response decode"),
}
# Links against which the compression figures are read (MB/s = bytes per µs).
LINKS_MB_S = {"100 Mbit/s": 12.5, "1 Gbit/s": 125.0, "10 Gbit/s": 1250.0}
_PER_OP = (
    "redis_in_bytes_per_op",
    "redis_out_bytes_per_op",
    "redis_commands_per_op",
    "request_message_bytes",
    "request_body_bytes",
    "response_bytes",
    "caller_allocated_bytes",
)


def _weighted(values: list[tuple[float | None, float]]) -> float | None:
    if any(v is None for v, _ in values):
        return None
    return sum(v * w for v, w in values if v is not None)


def _weighted_percentile(samples: list[tuple[list[float], float]], q: float) -> float | None:
    """The q-th percentile of every sample, each weighted by its group's weight per sample."""
    pairs = sorted((x, w / len(xs)) for xs, w in samples if xs for x in xs)
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    target, running = total * q / 100, 0.0
    for value, weight in pairs:
        running += weight
        if running >= target:
            return value
    return pairs[-1][0]


def mix_cells(cells: list[dict[str, Any]], mix: dict[int, float]) -> list[dict[str, Any]]:
    """One mixed row per workload and system, from the per-size cells."""
    rows = []
    for workload in WORKLOADS:
        for system in SYSTEMS:
            group = {
                c["payload_bytes"]: c
                for c in cells
                if c["workload"] == workload and c["system"] == system
            }
            if set(group) != set(mix):
                continue
            parts = group[next(iter(group))]["cpu_ms_per_op"]
            row: dict[str, Any] = {
                "workload": workload,
                "system": system,
                "payload_bytes": "mix",
                "ok": sum(c["ok"] for c in group.values()),
                "errors": sum(c["errors"] for c in group.values()),
                "cpu_ms_per_op": {
                    part: _weighted([(group[s]["cpu_ms_per_op"][part], w) for s, w in mix.items()])
                    for part in parts
                },
                **{k: _weighted([(group[s][k], w) for s, w in mix.items()]) for k in _PER_OP},
                "worker_rss_mb": max(c["worker_rss_mb"] or 0 for c in group.values()),
                "worker_hwm_mb": max(c["worker_hwm_mb"] or 0 for c in group.values()),
            }
            samples = [(group[s]["latencies_ms"], w) for s, w in mix.items()]
            row["p50_ms"] = _weighted_percentile(samples, 50)
            row["p99_ms"] = _weighted_percentile(samples, 99)
            rows.append(row)
    return rows


def serialization_us(
    fixtures: list[dict[str, Any]], mix: dict[int, float]
) -> dict[tuple[str, str, int | str], float]:
    """CPU µs of the serialization each of (b) and (c) runs per read, by workload and size."""
    found: dict[tuple[str, str, int | str], float] = {}
    for (system, workload), steps in PATH_STEPS.items():
        for row in fixtures:
            if row["system"] == system:
                cost = sum(row["steps"][s]["cpu_us"] for s in steps)
                found[(system, workload, row["payload_bytes"])] = cost
        per_size = [(found.get((system, workload, s)), w) for s, w in mix.items()]
        mixed = _weighted(per_size)
        if mixed is not None:
            found[(system, workload, "mix")] = mixed
    return found


def _near(cpu: dict[str, float]) -> float:
    """The CPU the fixtures can speak for: the caller's and the worker's."""
    return cpu["caller"] + cpu["worker"]


def credit(
    rows: list[dict[str, Any]], fixtures: list[dict[str, Any]], mix: dict[int, float]
) -> list[dict[str, Any]]:
    """Per workload and size: what (a) -> (b) and (b) -> (c) changed (the later
    system's CPU less the earlier's: negative is saved), and how much of
    (b) -> (c) in the caller and the worker the serialization fixtures account for."""
    serial = serialization_us(fixtures, mix)
    by_key = {(r["workload"], r["payload_bytes"], r["system"]): r for r in rows}
    out = []
    sizes: list[int | str] = [*mix, "mix"]
    for workload in WORKLOADS:
        for size in sizes:
            cells = [by_key.get((workload, size, s)) for s in SYSTEMS]
            if any(c is None or c["cpu_ms_per_op"]["total"] is None for c in cells):
                continue
            a, b, c = (cell["cpu_ms_per_op"] for cell in cells if cell is not None)
            near_bc = _near(c) - _near(b)
            serial_bc = (serial[("c", workload, size)] - serial[("b", workload, size)]) / 1000
            p50 = {s: cell["p50_ms"] for s, cell in zip(SYSTEMS, cells, strict=True) if cell}
            out.append(
                {
                    "workload": workload,
                    "payload_bytes": size,
                    "total_ms": {"a": a["total"], "b": b["total"], "c": c["total"]},
                    "a_to_b_ms": b["total"] - a["total"],
                    "b_to_c_ms": c["total"] - b["total"],
                    "b_to_c_caller_worker_ms": near_bc,
                    "b_to_c_serialization_ms": serial_bc,
                    "b_to_c_rest_ms": near_bc - serial_bc,
                    "b_to_c_redis_ms": c["redis"] - b["redis"],
                    "p50_ms": p50,
                }
            )
    return out


def compression_verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """A sentence per payload at zlib level 1 (and 6 where it saves more), from
    the figures: bytes saved against CPU, as the link rate below which the
    saved transfer time exceeds the CPU (per transfer: compress and decompress;
    compressed once at fill: decompress only)."""
    sentences = []
    for row in rows:
        saved = row["payload_bytes"] - row["compressed_bytes"]
        name = f"{row['payload']} {row['payload_bytes']:,} B, zlib-{row['level']}"
        ratio = row["payload_bytes"] / row["compressed_bytes"]
        if saved <= 0:
            sentences.append(
                f"{name}: {row['compressed_bytes']:,} B ({-saved:,} B more) for "
                f"{row['compress_us']:.0f} µs: never pays."
            )
            continue
        both = row["compress_us"] + row["decompress_us"]
        per_transfer = saved / both
        once = saved / row["decompress_us"]
        pays = [link for link, rate in LINKS_MB_S.items() if rate < per_transfer]
        sentences.append(
            f"{name}: {ratio:.1f}x ({saved:,} B saved) for {row['compress_us']:.0f} µs + "
            f"{row['decompress_us']:.0f} µs; pays on links slower than {per_transfer:,.0f} MB/s "
            f"per transfer ({', '.join(pays) or 'none of ' + ', '.join(LINKS_MB_S)}), "
            f"{once:,.0f} MB/s if compressed once at fill."
        )
    return sentences

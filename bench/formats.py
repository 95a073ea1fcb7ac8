"""CPU per record of the cache's two formats: v1 JSON against v2 protobuf.

    .venv/bin/python bench/formats.py [--repeats 15] [--min-time 0.05] [--json out.json]

For payloads of 100 B, 1 KB and 32 KB (random bytes, so nothing compresses)
it times the codecs of :mod:`dataservice.cache.formats` on ``pb.Record``
messages, the form the cache works with:

- **encode**: ``codec.encode(record)``;
- **decode**: ``codec.decode(body)``, with all of v1's checks;
- **encode+decode**: ``codec.decode(codec.encode(record))``, one fill and one hit.

Framing and the record's conversion to and from ``pb.Record`` are left out:
both formats pay them alike. **Stored bytes** is what one entry takes in Redis,
framed (``frame(revision, body)``), without the key.

Each sample is the CPU time (``time.process_time_ns``: time lost to other
processes on a shared machine does not count) of enough passes over
``--records`` distinct records to last ``--min-time`` seconds, with the
garbage collector off. The two formats alternate (v1 v2, then v2 v1) in each
of ``--repeats`` rounds, and the reported figure is the median of the rounds,
per record, in ns. Target: **v2's encode+decode at most a quarter of v1's at
1 KB.** Needs neither Redis nor MariaDB.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataservice_tools.testkit.machine import host, version
from google.protobuf.internal import api_implementation
from rich.console import Console
from rich.table import Table

from bench import _env
from dataservice.cache.formats import CODECS, Codec, frame
from dataservice.enums import CacheFormat
from dataservice.proto import pb

SIZES = (100, 1024, 32 * 1024)
TARGET_SIZE = 1024
TARGET_RATIO = 0.25
OPERATIONS = ("encode", "decode", "encode+decode")
# 2026-12-01 12:00 UTC: any realistic instant; its digits are all that matter to v1.
UPDATED_AT_UNIX_MS = 1_796_126_400_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=15, help="rounds per size and operation")
    p.add_argument("--min-time", type=float, default=0.05, help="CPU seconds per sample")
    p.add_argument("--records", type=int, default=64, help="distinct records per size")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.records < 1 or args.min_time <= 0:
        p.error("--repeats, --records and --min-time must be positive")
    return args


def make_records(size: int, count: int) -> list[pb.Record]:
    return [
        pb.Record(
            object_id=f"bench:{i:08d}",
            revision=1000 + i,
            payload=os.urandom(size),
            updated_at_unix_ms=UPDATED_AT_UNIX_MS,
        )
        for i in range(count)
    ]


def operation(codec: Codec, name: str) -> tuple[Callable[[Any], object], bool]:
    """The call to time, and whether it takes bodies (else records)."""
    encode, decode = codec.encode, codec.decode
    if name == "encode":
        return encode, False
    if name == "decode":
        return decode, True
    return lambda record: decode(encode(record)), False


def sample_ns(call: Callable[[Any], object], items: list[Any]) -> int:
    """CPU ns of one pass of ``call`` over ``items``."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        started = time.process_time_ns()
        for item in items:
            call(item)
        return time.process_time_ns() - started
    finally:
        if gc_was_on:
            gc.enable()


def passes_for(call: Callable[[Any], object], items: list[Any], min_time_s: float) -> int:
    """How many passes over ``items`` make one sample last ``min_time_s``."""
    passes = 1
    while sample_ns(call, items * passes) < min_time_s * 1e9:
        passes *= 2
    return passes


def measure_size(size: int, args: argparse.Namespace) -> dict[str, Any]:
    records = make_records(size, args.records)
    bodies = {fmt: [codec.encode(r) for r in records] for fmt, codec in CODECS.items()}
    for fmt, codec in CODECS.items():
        assert [codec.decode(b) for b in bodies[fmt]] == records, f"{fmt} does not round-trip"
    per_record: dict[CacheFormat, dict[str, Any]] = {fmt: {} for fmt in CODECS}
    for name in OPERATIONS:
        batches: dict[CacheFormat, tuple[Callable[[Any], object], list[Any]]] = {}
        for fmt, codec in CODECS.items():
            call, takes_bodies = operation(codec, name)
            items = bodies[fmt] if takes_bodies else records
            batches[fmt] = (call, items * passes_for(call, items, args.min_time))
        rounds: dict[CacheFormat, list[float]] = {fmt: [] for fmt in CODECS}
        order = list(CODECS)
        for _ in range(args.repeats):
            for fmt in order:
                call, batch = batches[fmt]
                rounds[fmt].append(sample_ns(call, batch) / len(batch))
            order.reverse()
        for fmt, values in rounds.items():
            per_record[fmt][name] = {
                "median_ns": round(statistics.median(values), 1),
                "min_ns": round(min(values), 1),
                "max_ns": round(max(values), 1),
                "records_per_sample": len(batches[fmt][1]),
            }
    for fmt in CODECS:
        stored = {len(frame(r.revision, b)) for r, b in zip(records, bodies[fmt], strict=True)}
        per_record[fmt]["stored_bytes"] = max(stored)
    v1, v2 = per_record[CacheFormat.V1], per_record[CacheFormat.V2]
    return {
        "payload_bytes": size,
        **{fmt.value: per_record[fmt] for fmt in CODECS},
        "v2_over_v1": {
            **{
                name: round(v2[name]["median_ns"] / v1[name]["median_ns"], 3) for name in OPERATIONS
            },
            "stored_bytes": round(v2["stored_bytes"] / v1["stored_bytes"], 3),
        },
    }


def machine() -> dict[str, Any]:
    return {
        **host(),
        "protobuf": f"{version('protobuf')} ({api_implementation.Type()})",
    }


def print_report(console: Console, report: dict[str, Any]) -> None:
    m = report["machine"]
    console.print(_env.host_line(m, f"protobuf {m['protobuf']}"))
    table = Table(title="cache formats: CPU ns per record (median of rounds), stored bytes")
    for column in ("payload", "format", *OPERATIONS, "stored bytes"):
        table.add_column(column, justify="left" if column == "format" else "right")
    for row in report["results"]:
        for fmt in CacheFormat:
            figures = row[fmt.value]
            table.add_row(
                f"{row['payload_bytes']:,} B",
                fmt.value,
                *(f"{figures[name]['median_ns']:,.0f}" for name in OPERATIONS),
                f"{figures['stored_bytes']:,}",
            )
        ratio = row["v2_over_v1"]
        table.add_row(
            "",
            "v2/v1",
            *(f"{ratio[name]:.3f}" for name in OPERATIONS),
            f"{ratio['stored_bytes']:.3f}",
            end_section=True,
        )
    console.print(table)
    target = report["target"]
    console.print(
        f"v2/v1 encode+decode CPU at {TARGET_SIZE:,} B: {target['ratio']:.3f} "
        f"(target <= {TARGET_RATIO}: {'met' if target['met'] else 'not met'})"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    facts = machine()
    started = time.monotonic()
    results = []
    for size in SIZES:
        with console.status(f"measuring {size:,} B payloads"):
            results.append(measure_size(size, args))
    at_target = next(r for r in results if r["payload_bytes"] == TARGET_SIZE)
    ratio = at_target["v2_over_v1"]["encode+decode"]
    report = {
        "command": " ".join(["python", "bench/formats.py", *sys.argv[1:]]),
        "machine": facts,
        "setup": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "sizes": list(SIZES),
            "elapsed_s": round(time.monotonic() - started, 1),
        },
        "results": results,
        "target": {
            "payload_bytes": TARGET_SIZE,
            "max_ratio": TARGET_RATIO,
            "ratio": ratio,
            "met": ratio <= TARGET_RATIO,
        },
    }
    print_report(console, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

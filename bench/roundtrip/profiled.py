"""Where the round trip's CPU goes: py-spy on the caller process and on each worker.

    .venv/bin/python -m bench.roundtrip.profiled [--seconds 8] [--callers 1] [--out DIR]

py-spy comes with the project's ``bench`` dependency group.

Same set-up as ``python -m bench.roundtrip`` (same isolated Redis dbs and database,
same worker subprocesses, same ``--systems``). For each system in turn it
samples the caller process and the worker (Dramatiq's: the process its command
line forks) for ``--seconds`` while ``--callers`` threads send
requests back to back, then prints the frames with the largest inclusive share
of the samples. Only the thread holding the GIL is sampled (``--gil``): both
processes are GIL-bound, so the shares are of the Python work that limits
them; without it, py-spy also counts threads that are runnable but waiting for
a CPU or inside a loopback ``send()``, which on an oversubscribed 2-core
machine inflates whatever frame issued the syscall. The raw collapsed stacks
are kept in ``--out`` for flame graphs.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.table import Table

from bench._env import sigterm_as_exit
from bench.roundtrip.systems import Bench, parse_args


def py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: pip install -e . --group bench")
    return found


def record(pid: int, seconds: float, out: Path, gil: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            py_spy(),
            "record",
            *(["--gil"] if gil else []),
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "500",
            "--function",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def inclusive_shares(path: Path) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """Total samples, and per frame its inclusive and self sample counts."""
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")]
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    return total, inclusive, own


def _short(frame: str) -> str:
    # "name (path/to/module.py:12)" -> "name (module.py:12)"
    name, _, where = frame.partition(" (")
    return f"{name} ({os.path.basename(where.rstrip(')'))})" if where else name


def main(argv: list[str] | None = None) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--seconds", type=float, default=8.0)
    extra.add_argument("--out", type=Path, default=Path("/tmp/dataservice-profile"))
    extra.add_argument("--top", type=int, default=30)
    extra.add_argument(
        "--no-gil",
        action="store_true",
        help="sample every running thread, not only the one holding the GIL",
    )
    own_args, rest = extra.parse_known_args(argv)
    args = parse_args(
        [*rest, "--callers", "1"] if "--callers" not in rest else rest,
        __doc__,
        "python -m bench.roundtrip.profiled",
    )
    own_args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench.create(args)
    with sigterm_as_exit():
        try:
            bench.setup()
            for system in bench.systems:
                files = {
                    "caller": own_args.out / f"{system}-caller.txt",
                    "worker": own_args.out / f"{system}-worker.txt",
                }
                spies = [
                    record(os.getpid(), own_args.seconds, files["caller"], not own_args.no_gil),
                    record(
                        bench.serving_pid(system),
                        own_args.seconds,
                        files["worker"],
                        not own_args.no_gil,
                    ),
                ]
                time.sleep(0.5)  # py-spy attaches
                done = 0
                deadline = time.monotonic() + own_args.seconds
                with bench.console.status(f"profiling {system}"):
                    while time.monotonic() < deadline:
                        done += len(bench.round(bench.callers, system, 20).latencies_ns)
                    for spy in spies:
                        spy.wait(own_args.seconds + 30)
                bench.console.print(f"{system}: {done} requests while sampling")
                for role, path in files.items():
                    _print_top(bench, f"{system} {role}", path, own_args.top)
        finally:
            bench.cleanup()
    return 0


def _print_top(bench: Bench, title: str, path: Path, top: int) -> None:
    if not path.exists():
        bench.console.print(f"[red]{title}: no samples ({path})[/red]")
        return
    total, inclusive, own = inclusive_shares(path)
    table = Table(title=f"{title}: {total} samples ({path})")
    table.add_column("inclusive %", justify="right")
    table.add_column("self %", justify="right")
    table.add_column("frame")
    for frame, count in inclusive.most_common(top):
        table.add_row(f"{100 * count / total:.1f}", f"{100 * own[frame] / total:.1f}", frame)
    bench.console.print(table)


if __name__ == "__main__":
    sys.exit(main())

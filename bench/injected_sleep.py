"""``SLEEP()`` under a statement timeout on MariaDB: why the injected sleep bounds itself.

    .venv/bin/python bench/injected_sleep.py [--connections 40] [--seconds 8]
                                             [--stall-s 5] [--json out.json]

The load tests make the database slow with an injected ``SLEEP()``
(``database.injected_delay_ms``; :class:`dataservice.store.sessions.InjectedDelay`).
Every other statement the service sends carries a server-side timeout
(``SET STATEMENT max_statement_time=... FOR``). This bench shows what the two
do together, on a MariaDB server of its own (a private ``mariadbd`` on a free
port, nothing shared): ``--connections`` connections each run one statement
after another for ``--seconds``, three ways, one after another:

- **timeout at the sleep's length**: ``max_statement_time=0.2 FOR SELECT SLEEP(0.2)``:
  the timeout fires as the sleep ends, as it does for a request whose deadline
  leaves the statement just the sleep's time;
- **timeout a little longer**: ``max_statement_time=0.205 FOR SELECT SLEEP(0.2)``;
- **no timeout**: ``SELECT SLEEP(0.2)``, as the service now sends it (the sleep
  cut to the statement's time instead).

It reports the statements finished and the slowest, and the ratio of each
way's statements to the untimed way's, in the same run. Then the stall: the
server is stopped (``SIGSTOP``) for ``--stall-s`` while the connections run
``max_statement_time=1.5 FOR SELECT SLEEP(0.2)`` (every timeout comes due
during the stall), and the same untimed; after ``SIGCONT`` it reports how long
until the first statement sent after the server resumed finished (none within
``--seconds``: reported as none).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import MySQLdb
from dataservice_tools.localservices.mariadb import PrivateMariaDB
from dataservice_tools.localservices.probes import free_port
from dataservice_tools.testkit.machine import host
from rich.console import Console
from rich.table import Table

from bench import _env

STEADY = {
    "timeout at the sleep's length": "SET STATEMENT max_statement_time=0.2 FOR SELECT SLEEP(0.2)",
    "timeout a little longer": "SET STATEMENT max_statement_time=0.205 FOR SELECT SLEEP(0.2)",
    "no timeout": "SELECT SLEEP(0.2)",
}
STALLED = {
    "timeout due during the stall": "SET STATEMENT max_statement_time=1.5 FOR SELECT SLEEP(0.2)",
    "no timeout": "SELECT SLEEP(0.2)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--connections", type=int, default=40)
    p.add_argument("--seconds", type=float, default=8.0, help="how long each way runs")
    p.add_argument("--stall-s", type=float, default=5.0, help="how long the server is stopped")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if args.connections < 1 or args.seconds <= 0 or args.stall_s <= 0:
        p.error("--connections, --seconds and --stall-s must be positive")
    return args


class Load:
    """``connections`` connections running ``statement`` one after another."""

    def __init__(self, port: int, statement: str, connections: int) -> None:
        self.finished: list[tuple[float, float]] = []  # (sent, done), monotonic
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(port, statement), daemon=True)
            for _ in range(connections)
        ]

    def _run(self, port: int, statement: str) -> None:
        conn = MySQLdb.connect(host="127.0.0.1", port=port, user="root")
        try:
            while not self._stop.is_set():
                sent = time.monotonic()
                cursor = conn.cursor()
                try:
                    cursor.execute(statement)
                    cursor.fetchall()
                except MySQLdb.OperationalError:
                    with self._lock:
                        self.errors += 1
                finally:
                    cursor.close()
                with self._lock:
                    self.finished.append((sent, time.monotonic()))
        finally:
            conn.close()

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def steady(port: int, statement: str, args: argparse.Namespace) -> dict[str, Any]:
    with Load(port, statement, args.connections) as load:
        time.sleep(args.seconds)
    return {
        "statements": len(load.finished),
        "slowest_s": round(max(done - sent for sent, done in load.finished), 3),
        "timed_out": load.errors,
    }


def stalled(server: PrivateMariaDB, statement: str, args: argparse.Namespace) -> dict[str, Any]:
    assert server.process is not None
    with Load(server.port, statement, args.connections) as load:
        time.sleep(1.0)
        os.kill(server.process.pid, signal.SIGSTOP)
        time.sleep(args.stall_s)
        os.kill(server.process.pid, signal.SIGCONT)
        resumed = time.monotonic()
        time.sleep(args.seconds)
    fresh = [done - resumed for sent, done in load.finished if sent > resumed]
    return {"first_fresh_finished_s": round(min(fresh), 3) if fresh else None}


def run(args: argparse.Namespace) -> dict[str, Any]:
    machine = host()
    directory = Path(tempfile.mkdtemp(prefix="bench-injected-sleep-"))
    # mariadbd runs as the mysql user, which must reach its directory.
    directory.chmod(0o755)
    server = PrivateMariaDB(directory / "mariadb", free_port())
    server.start()
    try:
        ways = {way: steady(server.port, sql, args) for way, sql in STEADY.items()}
        base = ways["no timeout"]["statements"]
        for figures in ways.values():
            figures["over_no_timeout"] = round(figures["statements"] / base, 3)
        stalls = {way: stalled(server, sql, args) for way, sql in STALLED.items()}
    finally:
        server.stop()
    return {
        "machine": machine,
        "connections": args.connections,
        "seconds": args.seconds,
        "stall_s": args.stall_s,
        "steady": ways,
        "after_stall": stalls,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = run(args)
    console = Console()
    console.print(_env.host_line(report["machine"], "MariaDB (private mariadbd)"))
    table = Table(title=f"{args.connections} connections, {args.seconds:g} s each way")
    for column in ("statement", "finished", "over no timeout", "slowest s", "timed out"):
        table.add_column(column, justify="left" if column == "statement" else "right")
    for way, f in report["steady"].items():
        table.add_row(
            way, str(f["statements"]), f"{f['over_no_timeout']:.3f}",
            f"{f['slowest_s']:.3f}", str(f["timed_out"]),
        )  # fmt: skip
    console.print(table)
    stall = Table(
        title=f"after a {args.stall_s:g} s stall: the first statement sent since finished"
    )
    stall.add_column("statement")
    stall.add_column("after resuming, s", justify="right")
    for way, f in report["after_stall"].items():
        first = f["first_fresh_finished_s"]
        stall.add_row(way, "none" if first is None else f"{first:.3f}")
    console.print(stall)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

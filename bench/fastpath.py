"""A no-op served inline by :mod:`dataservice.worker.fastpath` vs a stock Celery no-op.

    .venv/bin/python bench/fastpath.py [--callers 16] [--requests N] [--json out.json]

Three systems, in alternating rounds (forward, then reverse order) so drift on
a noisy machine hits all alike:

- ``stock``: :mod:`bench.baselines.noop`'s no-op, Redis result backend, ``.delay().get()``;
- ``pool``: a task on the service's transport and serializer whose inline
  handler declines, so the pool answers by RPUSH and the caller BLPOPs;
- ``inline``: the same task and worker, answered by the inline handler on the
  consumer thread, by RPUSH, the caller BLPOPing.

Both workers run with the interactive lane's worker options (threads pool, the
lane's concurrency, prefetch 1, late acknowledgement, fair, no gossip or
mingle). Phases: one caller, sequential; then ``--callers`` threads back to
back. CPU per request for this process (the callers), the worker and
redis-server comes from ``/proc``. It flushes its own Redis dbs (``--stock-db``,
``--inline-db``; never 0) before and after.

The inline worker is this module: ``python -m bench.fastpath --worker --url URL``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from celery import Celery, Task
from dataservice_tools.loadtest.environment import flush_redis
from dataservice_tools.testkit.callers import Call, Caller, run_round
from dataservice_tools.testkit.cpu import Components
from dataservice_tools.testkit.series import Series
from rich.console import Console
from rich.table import Table

from bench import _env
from bench.baselines.noop import NOOP_TASK, make_app
from dataservice.broker.celery import CONTENT_TYPE, SERIALIZER
from dataservice.config.model import load_config
from dataservice.ops.processes import WorkerProcess, worker_environ
from dataservice.worker.fastpath import InlineMessage, serve_inline

STOCK, POOL, INLINE = "stock", "pool", "inline"
SYSTEMS = (STOCK, POOL, INLINE)
TASK = "bench.fastpath.noop"
QUEUE = "fastpath"
REPLY_TIMEOUT_S = 5
CPU_PARTS = ("client", "worker", "redis")


def make_inline_app(url: str) -> Celery:
    """The service's transport and serializer; stock Celery otherwise, no result backend."""
    app = Celery("bench-fastpath", set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_transport="dataservice.broker.redis:RedisTransport",
        broker_connection_retry_on_startup=True,
        result_backend=None,
        task_ignore_result=True,
        accept_content=[CONTENT_TYPE, "application/json"],
        task_default_queue=QUEUE,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    return app


def _reply_key(body: object) -> tuple[str, bytes]:
    """``MODE:KEY`` bodies: who should answer, and the list the caller waits on."""
    if not isinstance(body, bytes):
        return "", b""
    mode, _, key = body.partition(b":")
    return mode.decode(), key


def run_inline_worker(url: str, concurrency: int) -> None:
    from dataservice.compat.celery import PER_TASK_LOGGERS

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    app = make_inline_app(url)
    # Tight timeouts: the inline handler runs on the consumer thread.
    client = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)

    @app.task(name=TASK, bind=True, typing=False, ignore_result=True, shared=False)
    def noop(self: Task, body: bytes) -> None:
        client.rpush(_reply_key(body)[1], b"")

    def inline(message: InlineMessage) -> bool:
        mode, key = _reply_key(message.args[0] if message.args else None)
        if mode != INLINE:
            return False
        client.rpush(key, b"")
        return True

    serve_inline(noop, inline)
    app.Worker(
        hostname=f"fastpath-{os.getpid()}@{socket.gethostname()}",
        queues=[QUEUE],
        pool="threads",
        concurrency=concurrency,
        prefetch_multiplier=1,
        optimization="fair",
        loglevel="INFO",
        without_gossip=True,
        without_mingle=True,
    ).start()


def inline_call(url: str, mode: str) -> Call:
    app = make_inline_app(url)
    client = redis.Redis.from_url(url)

    def call() -> None:
        key = f"bench:reply:{uuid.uuid4().hex}"
        body = f"{mode}:{key}".encode()
        app.send_task(TASK, args=(body,), queue=QUEUE, serializer=SERIALIZER, ignore_result=True)
        if client.blpop([key], REPLY_TIMEOUT_S) is None:
            raise TimeoutError(f"no {mode} answer")

    return call


def stock_call(url: str) -> Call:
    noop = make_app(url).tasks[NOOP_TASK]

    def call() -> None:
        noop.delay().get(timeout=REPLY_TIMEOUT_S)

    return call


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--callers", type=int, default=16)
    p.add_argument("--requests", type=int, default=3200, help="per system and phase")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=int, default=300, help="per system")
    p.add_argument("--redis", default="redis://127.0.0.1:6379")
    p.add_argument("--stock-db", type=int, default=6)
    p.add_argument("--inline-db", type=int, default=7)
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", action="store_true", help="run the inline worker (internal)")
    p.add_argument("--url", help="with --worker: its broker")
    p.add_argument("--concurrency", type=int, default=4, help="with --worker")
    args = p.parse_args(argv)
    if 0 in (args.stock_db, args.inline_db) or args.stock_db == args.inline_db:
        p.error("--stock-db and --inline-db must differ and must not be 0")
    if args.callers < 1 or args.rounds < 1 or args.requests < args.rounds * args.callers:
        p.error("need callers >= 1, rounds >= 1 and requests >= rounds * callers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_inline_worker(args.url, args.concurrency)
        return 0
    console = Console(width=150)
    concurrency = str(load_config(_env.REPO / "queues.yml").lanes.interactive.concurrency)
    stock_url = f"{args.redis}/{args.stock_db}"
    inline_url = f"{args.redis}/{args.inline_db}"
    environ = worker_environ()
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_env.REPO), environ.get("PYTHONPATH")])
    )
    logdir = Path(tempfile.mkdtemp(prefix="dataservice-fastpath-"))
    stock_argv = [sys.executable, "-m", "bench.baselines.noop", "--url", stock_url]
    inline_argv = [sys.executable, "-m", "bench.fastpath", "--worker", "--url", inline_url]
    workers = {
        STOCK: WorkerProcess(
            [*stock_argv, "--concurrency", concurrency], environ, logdir / "stock.log", STOCK
        ),
        INLINE: WorkerProcess(
            [*inline_argv, "--concurrency", concurrency], environ, logdir / "inline.log", INLINE
        ),
    }
    callers: list[Caller] = []
    try:
        for url in (stock_url, inline_url):
            flush_redis(url)
        for worker in workers.values():
            worker.start()
        _env.wait_ready(workers[STOCK], stock_call(stock_url))
        _env.wait_ready(workers[INLINE], inline_call(inline_url, INLINE))
        pids = {STOCK: workers[STOCK].pid, POOL: workers[INLINE].pid, INLINE: workers[INLINE].pid}
        components = Components(pids, {"redis": _env.find_pid("redis-server")})
        factories = {
            STOCK: lambda _rng: stock_call(stock_url),
            POOL: lambda _rng: inline_call(inline_url, POOL),
            INLINE: lambda _rng: inline_call(inline_url, INLINE),
        }
        callers = [Caller(i, factories) for i in range(args.callers)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.ready.wait()
        phases = {"sequential": callers[:1], f"{args.callers} callers": callers}
        series = {p: {s: Series() for s in SYSTEMS} for p in phases}
        for phase, group in phases.items():
            for system in SYSTEMS:
                run_round(group, system, max(1, args.warmup // len(group)), components)
            per_caller = args.requests // args.rounds // len(group)
            for r in range(args.rounds):
                console.print(f"[dim]{phase}: round {r + 1}/{args.rounds}[/dim]")
                for system in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                    series[phase][system].runs.append(
                        run_round(group, system, per_caller, components)
                    )
                    for worker in workers.values():
                        worker.check_alive()
    finally:
        for caller in callers:
            caller.jobs.put(None)
        for worker in workers.values():
            worker.stop()
        for url in (stock_url, inline_url):
            flush_redis(url)
    report = _report(args, series)
    _print(console, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _report(args: argparse.Namespace, series: dict[str, dict[str, Series]]) -> dict[str, Any]:
    results = {p: {s: series[p][s].summary() for s in SYSTEMS} for p in series}
    ratios = {
        phase: {
            system: {
                "p50": r[system]["p50_ms"] / r[STOCK]["p50_ms"],
                "throughput": r[system]["throughput_per_s"] / r[STOCK]["throughput_per_s"],
            }
            for system in (POOL, INLINE)
        }
        for phase, r in results.items()
    }
    return {
        "command": " ".join(["python", "bench/fastpath.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "at": time.time()},
        "results": results,
        "ratios": ratios,
    }


def _print(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="no-op round trip: stock Celery vs pool reply vs inline fast path")
    for column in ("phase", "system", "n", "err", "p50 ms", "p99 ms", "req/s"):
        table.add_column(column, justify="left" if column in ("phase", "system") else "right")
    for part in CPU_PARTS:
        table.add_column(f"CPU {part}\nms/req", justify="right")
    table.add_column("p50 / stock", justify="right")
    table.add_column("req/s / stock", justify="right")
    for phase, by_system in report["results"].items():
        for system, r in by_system.items():
            cpu = r["cpu_ms_per_request"]
            ratio = report["ratios"][phase].get(system)
            table.add_row(
                phase,
                system,
                str(r["requests"]),
                str(r["errors"]),
                f"{r['p50_ms']:.2f}",
                f"{r['p99_ms']:.2f}",
                f"{r['throughput_per_s']:.0f}",
                *(f"{cpu[part]:.2f}" if cpu[part] is not None else "-" for part in CPU_PARTS),
                f"{ratio['p50']:.2f}x" if ratio else "1.00x",
                f"{ratio['throughput']:.2f}x" if ratio else "1.00x",
            )
        table.add_section()
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())

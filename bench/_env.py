"""What the benches set up and tear down beyond the package's own helpers
(:mod:`dataservice_tools.loadtest.environment` flushes Redis dbs, seeds records and
writes callers files; :mod:`dataservice.ops.processes` starts workers;
:mod:`dataservice_tools.testkit` holds what the tests share with them): the bench
database, the shipped configuration as the benches run it, a worker's readiness
by a probe request, the pids of the servers, SIGTERM as an exit (so that a bench
stopped by a signal still stops its workers), and the machine's facts on one
console line.

Only the bench's own Redis db numbers are flushed and only the bench's own
database is dropped; nothing else on the shared Redis or MariaDB is touched.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from dataservice.ops.processes import WorkerProcess, dataservice_argv

REPO = Path(__file__).resolve().parent.parent
# The caller the benches sign as: the shipped queues.yml gives it generous limits.
CALLER = "loadtest"


def redis_url(host: str, port: int, db: int) -> str:
    return f"redis://{host}:{port}/{db}"


# Database ------------------------------------------------------------------


def reset_database(url: str, environ: dict[str, str]) -> None:
    """Drop the bench database, then create it with ``dataservice db upgrade``."""
    drop_database(url)
    subprocess.run(
        dataservice_argv("db", "upgrade"),
        env=environ,
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def drop_database(url: str) -> None:
    parsed = make_url(url)
    if not parsed.database or not parsed.database.endswith("_bench"):
        raise ValueError(f"refusing to drop {parsed.database!r}: not a *_bench database")
    server = create_engine(parsed.set(database=""))
    try:
        with server.connect() as conn:
            quoted = server.dialect.identifier_preparer.quote_identifier(parsed.database)
            conn.execute(text(f"DROP DATABASE IF EXISTS {quoted}"))
    finally:
        server.dispose()


# Configuration -----------------------------------------------------------------


def unguarded_config(directory: Path, request_lines: str | None = None) -> Path:
    """The shipped queues.yml, reading the cache without a change consumer:
    none runs here, and nothing but the bench changes the records. With
    ``request_lines``, ``logging.requests`` set to it."""
    document = yaml.safe_load((REPO / "queues.yml").read_text(encoding="utf-8"))
    document["changes"]["guard"] = False
    if request_lines is not None:
        document.setdefault("logging", {})["requests"] = request_lines
    path = directory / "queues.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


# Processes -------------------------------------------------------------------


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_ready(
    worker: WorkerProcess, probe: Callable[[], object], timeout_s: float = 45.0
) -> float:
    """Call ``probe`` until it succeeds; seconds it took."""
    started = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - started < timeout_s:
        worker.check_alive()
        try:
            probe()
        except Exception as exc:
            last = exc
            continue
        return time.monotonic() - started
    raise RuntimeError(
        f"{worker.name} worker not ready after {timeout_s} s (last error: {last!r}):\n"
        f"{worker.log_tail()}"
    )


def find_pid(*names: str) -> int | None:
    """The first process whose comm is one of ``names`` (read-only /proc scan)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            return int(entry.name)
    return None


def rabbitmq_pid() -> int | None:
    """The pid of the local RabbitMQ node's Erlang VM (``rabbitmqctl``'s
    default node: the one the benchmarks' virtual hosts are on)."""
    done = subprocess.run(
        ["rabbitmqctl", "-q", "eval", "os:getpid()."],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    said = done.stdout.strip().strip('"')
    return int(said) if done.returncode == 0 and said.isdigit() else None


# Machine -----------------------------------------------------------------------


def host_line(machine: dict[str, Any], versions: str) -> str:
    """The figures of :func:`dataservice_tools.testkit.machine.host` on one
    console line, with the bench's ``versions``."""
    m = machine
    return (
        f"[bold]machine[/bold]: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), "
        f"Linux {m['kernel']}, Python {m['python']}, {versions}, load {m['loadavg_at_start']}"
    )

"""What the benches set up and tear down beyond the package's own helpers
(:mod:`dataservice_tools.loadtest.environment` flushes Redis dbs, seeds records and
writes callers files; :mod:`dataservice.ops.processes` starts workers): the bench
database, a worker's readiness by a probe request, the CPU time of processes,
and the facts about the machine that go next to the figures.

Only the bench's own Redis db numbers are flushed and only the bench's own
database is dropped; nothing else on the shared Redis or MariaDB is touched.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import redis
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


def database_version(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SELECT VERSION()")).scalar())
    finally:
        engine.dispose()


# Worker subprocesses ---------------------------------------------------------


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


# CPU accounting ----------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all threads), None if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5); fields[0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port`` (Linux: its open
    descriptors matched against ``/proc/net/tcp``)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for fields in (line.split() for line in Path(table).read_text().splitlines()[1:]):
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            # State 01: established.
            count += fields[9] in inodes and remote_port == port and fields[3] == "01"
    return count


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


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def host() -> dict[str, Any]:
    """The machine and interpreter a bench runs on, and its load as it starts."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": load,
    }


def host_line(machine: dict[str, Any], versions: str) -> str:
    """:func:`host`'s figures on one console line, with the bench's ``versions``."""
    m = machine
    return (
        f"[bold]machine[/bold]: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), "
        f"Linux {m['kernel']}, Python {m['python']}, {versions}, load {m['loadavg_at_start']}"
    )


def machine_info(redis_server_url: str, database_url: str) -> dict[str, Any]:
    from google.protobuf.internal import api_implementation

    client = redis.Redis.from_url(redis_server_url)
    try:
        redis_version = str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()
    return {
        **host(),
        "celery": _version("celery"),
        "kombu": _version("kombu"),
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "sqlalchemy": _version("sqlalchemy"),
        "mysqlclient": _version("mysqlclient"),
        "protobuf": f"{_version('protobuf')} ({api_implementation.Type()})",
        "redis_server": redis_version,
        "mariadb": database_version(database_url),
    }

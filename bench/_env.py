"""What ``bench/roundtrip.py`` sets up and tears down: Redis db numbers, the
bench database and its records, the callers file the service's workers verify
and its callers sign with, the two worker subprocesses, and the facts about
the machine that go next to the figures.

Only the bench's own Redis db numbers are flushed and only the bench's own
database is dropped; nothing else on the shared Redis or MariaDB is touched.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from dataservice.callers import write_callers_file

REPO = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1
# The caller the benches sign as: the shipped queues.yml gives it generous limits.
CALLER = "loadtest"


def callers_file(directory: Path, callers: tuple[str, ...] = (CALLER,)) -> Path:
    """A callers file (mode 600, a fresh key per caller) in the run's own directory."""
    path = directory / "callers.yml"
    write_callers_file(path, {caller: f"{caller}-1" for caller in callers})
    return path


def redis_url(host: str, port: int, db: int) -> str:
    return f"redis://{host}:{port}/{db}"


def flush_db(url: str) -> None:
    """FLUSHDB on exactly the db number in ``url`` (never db 0)."""
    client = redis.Redis.from_url(url)
    try:
        if client.connection_pool.connection_kwargs.get("db", 0) == 0:
            raise ValueError("refusing to flush Redis db 0")
        client.flushdb()
    finally:
        client.close()


# Database ------------------------------------------------------------------


def reset_database(url: str, environ: dict[str, str]) -> None:
    """Drop the bench database, then create it with ``dataservice db upgrade``."""
    drop_database(url)
    subprocess.run(
        [*dataservice_cli(), "db", "upgrade"],
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


def seed_records(url: str, scope: str, count: int, payload_bytes: int) -> list[str]:
    """Insert ``count`` records of random ``payload_bytes`` payloads; their ids."""
    from dataservice.loadtest.environment import seed_records as seed

    return seed(url, scope, count, payload_bytes)


def database_version(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SELECT VERSION()")).scalar())
    finally:
        engine.dispose()


# Worker subprocesses ---------------------------------------------------------


def dataservice_cli() -> list[str]:
    script = Path(sys.executable).parent / "dataservice"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from dataservice.cli import main; main()"]


# A SIGKILLed bench must not leave a worker consuming its queue: the worker is
# exec'd through this stub, which asks the kernel for SIGTERM when its parent
# dies (the request survives execve). A preexec_fn would do the same but is
# unsafe once the parent has threads.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "try:\n"
    f"    ctypes.CDLL('libc.so.6').prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGTERM)})\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


@dataclass
class WorkerProcess:
    """A worker started as a subprocess; its log goes to a file for post-mortems."""

    name: str
    argv: list[str]
    environ: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _DIE_WITH_PARENT, *self.argv],
            env=self.environ,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} worker exited early:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text_ = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text_.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL after ``grace_s``."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


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


def machine_info(redis_server_url: str, database_url: str) -> dict[str, Any]:
    from google.protobuf.internal import api_implementation

    client = redis.Redis.from_url(redis_server_url)
    try:
        redis_version = str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()
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
        "celery": _version("celery"),
        "kombu": _version("kombu"),
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "sqlalchemy": _version("sqlalchemy"),
        "mysqlclient": _version("mysqlclient"),
        "protobuf": f"{_version('protobuf')} ({api_implementation.Type()})",
        "redis_server": redis_version,
        "mariadb": database_version(database_url),
        "loadavg_at_start": load,
    }

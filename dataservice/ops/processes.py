"""Worker processes started by the service's own tools: ``dataservice run``, the
load harness, the benches and the tests.

A :class:`WorkerProcess` runs ``dataservice worker --lane LANE`` (or another
worker's argv, such as the naive baseline's) with this interpreter, in a
session of its own: a terminal's Ctrl-C reaches only the parent, which stops
its workers in order (SIGTERM, Celery's warm shutdown, then SIGKILL after a
grace). Its environment is this process's without any ``DATASERVICE_*``
variable, plus the settings it is given: a stray variable would override them,
or be refused as unknown. Its output goes to a log file whose tail explains an
early exit.

Workers count as ready once they answer a Celery control ping; their node
names end in their process id (``<lane>-<pid>@host``; the naive baseline's
``naive-<queue>-<pid>@host``), so :func:`wait_answering` knows exactly which
processes answered.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from celery import Celery

from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ServiceSetupError

PING_TIMEOUT_S = 0.5
# SIGKILL cannot be refused; this only bounds the wait for the kernel to reap it.
KILL_WAIT_S = 5.0
_ENV_PREFIX = "DATASERVICE_"
_PR_SET_PDEATHSIG = 1

# A parent killed with SIGKILL must not leave workers consuming its queues: each
# worker is exec'd through this stub, which asks the kernel for SIGTERM when its
# parent dies (the request survives execve). A preexec_fn would do the same but
# is unsafe once the parent has threads. The kernel's "parent" is the thread
# that started the worker, so start workers from a thread that outlives them.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "try:\n"
    f"    ctypes.CDLL('libc.so.6').prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGTERM)})\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def node_name(kind: str, pid: int | None = None) -> str:
    """A worker node's Celery name, ``<kind>-<pid>@<host>`` (``interactive``,
    ``batch``, ``changes``), this process's by default: how :func:`answering`
    and the supervisor tell the processes apart."""
    return f"{kind}-{os.getpid() if pid is None else pid}@{socket.gethostname()}"


def dataservice_argv(*args: str) -> list[str]:
    """``dataservice ARGS`` run by this interpreter, wherever the package is installed."""
    return [sys.executable, "-m", "dataservice.cli", *args]


def worker_argv(lane: LaneName, *extra: str) -> list[str]:
    """``dataservice worker --lane LANE`` plus ``extra`` (``--metrics-port``, ...)."""
    return dataservice_argv("worker", "--lane", lane.value, *extra)


def worker_environ(settings: Settings | None = None) -> dict[str, str]:
    """This process's environment without ``DATASERVICE_*``, plus ``settings``'."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIX)}
    if settings is not None:
        environ.update(settings.to_env())
    return environ


class WorkerProcess:
    """One worker subprocess: started, checked and stopped by its parent."""

    def __init__(
        self, argv: Sequence[str], environ: Mapping[str, str], log_path: Path, name: str = "worker"
    ) -> None:
        self.argv = list(argv)
        self.environ = dict(environ)
        self.log_path = log_path
        self.name = name
        self._process: subprocess.Popen[bytes] | None = None
        # Set once the parent asked it to go: its exit is then no failure.
        self._stopping = False

    @classmethod
    def for_lane(
        cls, settings: Settings, lane: LaneName, log_path: Path, *extra: str
    ) -> WorkerProcess:
        """``dataservice worker --lane LANE extra...`` with ``settings``' environment."""
        return cls(worker_argv(lane, *extra), worker_environ(settings), log_path, lane.value)

    @classmethod
    def for_command(
        cls, settings: Settings, log_path: Path, command: str, *args: str
    ) -> WorkerProcess:
        """``dataservice COMMAND args...`` (``changes``, ``flower``) with ``settings``."""
        argv = dataservice_argv(command, *args)
        return cls(argv, worker_environ(settings), log_path, command)

    def start(self) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Appended: a restarted worker's log follows the one before it.
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _DIE_WITH_PARENT, *self.argv],
                env=self.environ,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._stopping = False
        return self

    def _popen(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise ServiceSetupError(f"{self.name} worker was never started")
        return self._process

    @property
    def pid(self) -> int:
        return self._popen().pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited (negative: the signal that ended it)."""
        return None if self._process is None else self._process.poll()

    @property
    def started(self) -> bool:
        return self._process is not None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def check_alive(self) -> None:
        """Raise, with the log's tail, if it exited without being asked to."""
        code = self._popen().poll()
        if code is not None and not self._stopping:
            raise ServiceSetupError(
                f"{self.name} worker (pid {self.pid}) exited with {code}; "
                f"{self.log_path} ends:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` while it runs; any exit after this one was asked for."""
        self._stopping = True
        if self.running:
            self._popen().send_signal(signum)

    def terminate(self) -> None:
        """SIGTERM (Celery's warm shutdown: requests in progress finish first),
        sent once however often it is asked for."""
        if not self._stopping:
            self.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        """Its exit status; ``subprocess.TimeoutExpired`` if still running after ``timeout_s``."""
        return self._popen().wait(timeout_s)

    def stop(self, grace_s: float = 10.0) -> None:
        stop_all([self], grace_s)


def stop_all(workers: Iterable[WorkerProcess], grace_s: float = 10.0) -> None:
    """SIGTERM to all at once, then SIGKILL to any still running after ``grace_s``."""
    started = [w for w in workers if w.started]
    for worker in started:
        worker.terminate()
    deadline = time.monotonic() + grace_s
    for worker in started:
        try:
            worker.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGKILL)
            worker.wait(KILL_WAIT_S)


def answering(control: Celery, expected: int | None = None) -> set[int]:
    """Process ids of the workers that answer a control ping on ``control``'s
    broker; the wait ends as soon as ``expected`` of them have, if given."""
    pids: set[int] = set()
    # A connection of its own, not one of kombu's process-wide pool: a broker
    # that restarted leaves the pooled ones dead, and the first use of each
    # would fail.
    connection = control.connection_for_write()
    try:
        replies = (
            control.control.ping(timeout=PING_TIMEOUT_S, limit=expected, connection=connection)
            or []
        )
    except (OSError, *connection.connection_errors):
        return pids  # Nobody answered this time.
    finally:
        connection.release()
    for reply in replies:
        node = str(next(iter(reply)))
        pid = node.partition("@")[0].rpartition("-")[2]
        if pid.isdigit():
            pids.add(int(pid))
    return pids


Workers = Iterable[WorkerProcess] | Callable[[], Iterable[WorkerProcess]]


def wait_answering(
    control: Celery,
    workers: Workers,
    timeout_s: float = 60.0,
    *,
    check: Callable[[], None] | None = None,
) -> float:
    """Wait until every worker answers a control ping; seconds it took.

    Each round first runs ``check``; by default every worker's
    :meth:`~WorkerProcess.check_alive`, so one that died ends the wait with its
    log. A caller that restarts workers instead passes its restart as ``check``
    and ``workers`` as a function, so a restarted worker is awaited by its new pid.
    """
    started = time.monotonic()
    while True:
        group = list(workers() if callable(workers) else workers)
        if check is not None:
            check()
        else:
            for worker in group:
                worker.check_alive()
        heard = answering(control, len(group))
        missing = [w for w in group if not w.running or w.pid not in heard]
        if not missing:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            names = ", ".join(w.name for w in missing)
            logs = ", ".join(str(w.log_path) for w in missing)
            raise ServiceSetupError(
                f"{names} did not answer a control ping within {timeout_s:.0f} s; see {logs}"
            )

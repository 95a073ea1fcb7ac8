"""Local Redis and MariaDB for development, tests and the demo.

``python -m dataservice.localservices up`` makes sure the Redis and MariaDB
named by the ``DATASERVICE_*`` URLs answer; when one does not and its URL
points at this machine, a private instance is started from the installed
binaries with its data in a state directory (``.state/`` in the repository),
and keeps running until ``python -m dataservice.localservices down``.

:class:`PrivateMariaDB` also starts a throw-away MariaDB with a ROW-format
binary log on a free port, for tests and demos that read the change stream.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import MySQLdb
import redis
from sqlalchemy.engine import make_url

from dataservice.callers import ensure_callers_file
from dataservice.errors import DataServiceError, ServiceSetupError
from dataservice.settings import Settings

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
START_TIMEOUT_S = 30.0
DEFAULT_STATE_DIR = Path(__file__).resolve().parent.parent / ".state"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def redis_reachable(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def mysql_reachable(host: str, port: int, user: str = "root", password: str = "") -> bool:
    try:
        conn = MySQLdb.connect(
            host=host, port=port, user=user, password=password, connect_timeout=1
        )
    except MySQLdb.Error:
        return False
    conn.close()
    return True


def _binary(name: str) -> str:
    for candidate in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ServiceSetupError(
        f"{name} is not installed (Debian: apt-get install redis-server mariadb-server)"
    )


def _traversable_by_others(path: Path) -> bool:
    """Whether a user other than the owner (mariadbd's ``mysql``) can reach ``path``."""
    for directory in (path.resolve(), *path.resolve().parents):
        if not directory.stat().st_mode & stat.S_IXOTH:
            return False
    return True


def _wait(check: object, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.1)
    hint = f"; see {log}" if log else ""
    raise ServiceSetupError(f"{what} did not become ready within {START_TIMEOUT_S:.0f} s{hint}")


def start_redis(state_dir: Path, port: int) -> None:
    """Start a private redis-server (daemonized, nothing persisted)."""
    directory = state_dir / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            _binary("redis-server"), "--daemonize", "yes", "--bind", "127.0.0.1",
            "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(directory), "--pidfile", str(directory / "redis.pid"),
            "--logfile", str(directory / "redis.log"),
        ],
        check=True,
    )  # fmt: skip
    _wait(lambda: redis_reachable(f"redis://127.0.0.1:{port}/0"), "redis", directory / "redis.log")


class PrivateMariaDB:
    """A MariaDB server of our own: its data directory, port and lifetime.

    With ``binlog=True`` it writes a ROW-format binary log with full row images
    and metadata, as the change-stream reader needs.
    """

    def __init__(self, directory: Path, port: int, *, binlog: bool = False) -> None:
        self.directory = directory
        self.port = port
        self.binlog = binlog
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "error.log"

    def url(self, database: str = "dataservice") -> str:
        return f"mysql+mysqldb://root@127.0.0.1:{self.port}/{database}"

    def _as_mysql_user(self) -> list[str]:
        # mariadbd refuses to run as root; it drops to the mysql user itself.
        return ["--user=mysql"] if os.geteuid() == 0 else []

    def _install(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            if not _traversable_by_others(self.directory.parent):
                raise ServiceSetupError(
                    f"the mysql user cannot reach {self.directory}: a parent directory is "
                    "closed to other users (use a state directory outside it)"
                )
            shutil.chown(self.directory, "mysql", "mysql")
            shutil.chown(self.datadir, "mysql", "mysql")
        done = subprocess.run(
            [
                _binary("mariadb-install-db"), "--no-defaults", *self._as_mysql_user(),
                f"--datadir={self.datadir}", "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=False, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ServiceSetupError("mariadb-install-db failed: " + " | ".join(detail))

    def start(self, *, detach: bool = False) -> PrivateMariaDB:
        """Start the server; with ``detach`` it outlives this process (stop it by pid file)."""
        if not (self.datadir / "mysql").is_dir():
            self._install()
        args = [
            _binary("mariadbd"), "--no-defaults", *self._as_mysql_user(),
            f"--datadir={self.datadir}", f"--port={self.port}", "--bind-address=127.0.0.1",
            f"--socket={self.directory / 'mariadb.sock'}",
            f"--pid-file={self.directory / 'mariadb.pid'}",
            f"--log-error={self.log}", "--innodb-buffer-pool-size=64M", "--max-connections=500",
        ]  # fmt: skip
        if self.binlog:
            args += [
                f"--log-bin={self.datadir / 'binlog'}", "--binlog-format=ROW",
                "--binlog-row-image=FULL", "--binlog-row-metadata=FULL", "--server-id=1",
            ]  # fmt: skip
        # Its own session: Ctrl-C in the terminal that started it does not reach it.
        # Start-up chatter before --log-error takes effect is not worth showing.
        if detach:
            # The shell exits at once, so the server is nobody's child to reap.
            subprocess.run(
                ["sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", *args],
                check=True, start_new_session=True,
            )  # fmt: skip
        else:
            self.process = subprocess.Popen(
                args, start_new_session=True, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        _wait(self._ready, f"MariaDB on port {self.port}", self.log)
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ServiceSetupError(
                f"mariadbd exited with {self.process.returncode}; see {self.log}"
            )
        return mysql_reachable("127.0.0.1", self.port)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> PrivateMariaDB:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class TemporaryBinlogMariaDB(PrivateMariaDB):
    """A binlog-enabled MariaDB in a temporary directory on a free port, removed on exit."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="dataservice-mariadb-")
        # The temporary directory itself is private; the server lives one level down.
        Path(self._tmp.name).chmod(0o755)
        super().__init__(Path(self._tmp.name) / "server", free_port(), binlog=True)

    def stop(self) -> None:
        super().stop()
        self._tmp.cleanup()


def mariadb_dir(state_dir: Path) -> Path:
    """Where ``up`` keeps its MariaDB: in the state directory if the server's
    user can reach it (as root, mariadbd runs as ``mysql``), else in /var/tmp."""
    if os.geteuid() != 0 or _traversable_by_others(state_dir):
        return state_dir / "mariadb"
    tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    fallback = Path("/var/tmp") / f"dataservice-{tag}"
    fallback.mkdir(mode=0o755, exist_ok=True)
    return fallback / "mariadb"


def _local(host: str | None) -> bool:
    return host is None or host in LOCAL_HOSTS


def up(settings: Settings, state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Make the configured Redis and MariaDB reachable; returns what was started."""
    started = []
    for url in dict.fromkeys(
        (settings.broker_url, settings.result_backend_url, settings.redis_url)
    ):
        if redis_reachable(url):
            continue
        parsed = make_url(url.replace("redis://", "mysql://", 1))  # same URL grammar
        if not _local(parsed.host):
            raise ServiceSetupError(f"Redis at {parsed.host}:{parsed.port} is unreachable")
        start_redis(state_dir, parsed.port or 6379)
        started.append(f"redis on port {parsed.port or 6379}")
    db = make_url(settings.database_url)
    if not mysql_reachable(
        db.host or "127.0.0.1", db.port or 3306, db.username or "root", db.password or ""
    ):
        if not _local(db.host):
            raise ServiceSetupError(f"MariaDB at {db.host}:{db.port} is unreachable")
        PrivateMariaDB(mariadb_dir(state_dir), db.port or 3306).start(detach=True)
        started.append(f"mariadb on port {db.port or 3306}")
    return started


def down(state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Stop the private instances that ``up`` started."""
    stopped = []
    for name, pidfile in (("redis", state_dir / "redis" / "redis.pid"),
                          ("mariadb", mariadb_dir(state_dir) / "mariadb.pid")):  # fmt: skip
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        _wait(lambda pid=pid: not _alive(pid), f"{name} (pid {pid}) to stop")
        stopped.append(name)
    return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataservice.localservices")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            settings = Settings.from_env()
            done = up(settings, args.state_dir)
            print("started: " + ", ".join(done) if done else "redis and mariadb are reachable")
            added = ensure_callers_file(settings, settings.load())
            if added:
                print(f"{settings.callers_file}: new keys for {', '.join(added)}")
            # Imported here: the ACL rules need the configuration, the rest of this module not.
            from dataservice.acl import apply_from_settings

            users = apply_from_settings(settings)
            if users:
                print("redis users: " + ", ".join(users))
        else:
            done = down(args.state_dir)
            print("stopped: " + (", ".join(done) or "nothing"))
    except DataServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

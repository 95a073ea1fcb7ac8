"""A MariaDB server of our own: for ``up``, and a throw-away one with a binary log."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from dataservice.errors import ServiceSetupError
from dataservice_tools.localservices.probes import (
    binary,
    free_port,
    mysql_reachable,
    server_dir,
    traversable_by_others,
    wait_until,
)


class PrivateMariaDB:
    """A MariaDB server of our own: its data directory, port and lifetime.

    With ``binlog=True`` it writes a ROW-format binary log with full row images
    and metadata, as the change-stream reader needs.
    """

    def __init__(
        self,
        directory: Path,
        port: int,
        *,
        binlog: bool = False,
        options: tuple[str, ...] = (),
        bind_address: str = "127.0.0.1",
    ) -> None:
        self.directory = directory
        self.port = port
        self.binlog = binlog
        self.bind_address = bind_address
        # More mariadbd options, given on every start.
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "error.log"

    def url(self, database: str = "dataservice") -> str:
        return f"mysql+mysqldb://root@{self.bind_address}:{self.port}/{database}"

    def _as_mysql_user(self) -> list[str]:
        # mariadbd refuses to run as root; it drops to the mysql user itself.
        return ["--user=mysql"] if os.geteuid() == 0 else []

    def _install(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            if not traversable_by_others(self.directory.parent):
                raise ServiceSetupError(
                    f"the mysql user cannot reach {self.directory}: a parent directory is "
                    "closed to other users (use a state directory outside it)"
                )
            shutil.chown(self.directory, "mysql", "mysql")
            shutil.chown(self.datadir, "mysql", "mysql")
        done = subprocess.run(
            [
                binary("mariadb-install-db"), "--no-defaults", *self._as_mysql_user(),
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
            binary("mariadbd"), "--no-defaults", *self._as_mysql_user(),
            f"--datadir={self.datadir}", f"--port={self.port}",
            f"--bind-address={self.bind_address}",
            f"--socket={self.directory / 'mariadb.sock'}",
            f"--pid-file={self.directory / 'mariadb.pid'}",
            f"--log-error={self.log}", "--innodb-buffer-pool-size=64M", "--max-connections=500",
        ]  # fmt: skip
        args += self.options
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
        wait_until(self._ready, f"MariaDB on port {self.port}", self.log)
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ServiceSetupError(
                f"mariadbd exited with {self.process.returncode}; see {self.log}"
            )
        return mysql_reachable(self.bind_address, self.port)

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
    """Where ``up`` keeps its MariaDB (as root, mariadbd runs as ``mysql``)."""
    return server_dir(state_dir, "mariadb")


def binlog_mariadb_dir(state_dir: Path) -> Path:
    """Where ``up`` keeps the binlog MariaDB it starts beside a configured one
    without a binlog (:mod:`.binlog`): next to :func:`mariadb_dir`'s."""
    return mariadb_dir(state_dir).with_name("binlog-mariadb")

"""A private Redis that speaks TLS only, with a throw-away CA, for the TLS tests."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from dataservice_tools.localservices import free_port
from dataservice_tools.localservices.certificates import Certificates, make_certificates
from dataservice_tools.testkit.waits import eventually

from tests.conftest import require

_START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TLSRedis:
    port: int
    certificates: Certificates
    log: Path

    def url(self, db: int = 0, query: str = "") -> str:
        """A ``rediss://`` URL trusting the throw-away CA, plus ``query``."""
        options = f"ssl_ca_certs={self.certificates.ca}" + (f"&{query}" if query else "")
        return f"rediss://127.0.0.1:{self.port}/{db}?{options}"


def require_tls_tools() -> None:
    for tool in ("openssl", "redis-server"):
        require(shutil.which(tool) is not None, f"the {tool} command")


@contextmanager
def tls_redis(directory: Path) -> Iterator[TLSRedis]:
    """redis-server listening on a TLS port and no plain one, stopped on exit."""
    require_tls_tools()
    certificates = make_certificates(directory)
    server = TLSRedis(free_port(), certificates, directory / "redis.log")
    with server.log.open("wb") as log:
        process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", "0",
             "--tls-port", str(server.port),
             "--tls-cert-file", str(certificates.server_cert),
             "--tls-key-file", str(certificates.server_key),
             "--tls-ca-cert-file", str(certificates.ca),
             "--tls-auth-clients", "no", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--dir", str(directory)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        _wait_until_ready(server, process)
        yield server
    finally:
        process.kill()
        process.wait(timeout=10)


def _wait_until_ready(server: TLSRedis, process: subprocess.Popen[bytes]) -> None:
    client = redis.Redis.from_url(server.url(), socket_connect_timeout=1, socket_timeout=1)

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited; see {server.log}")
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        eventually(answers, timeout=_START_TIMEOUT_S, interval=0.02,
                   message=f"redis-server over TLS to answer; see {server.log}")  # fmt: skip
    finally:
        client.close()

"""A Sentinel-managed Redis of our own: a primary, a replica and one or more
Sentinels, all from the one ``redis-server`` binary (``--sentinel``; no
separate ``redis-sentinel`` is needed), on ports of their own, nothing persisted.

What a cell's failover is tested against: :meth:`SentinelGroup.kill_primary`
SIGKILLs whichever server is the primary now, and
:meth:`SentinelGroup.wait_promoted` waits until the Sentinel names another.
With one Sentinel (the default) the quorum is one and it decides alone:
enough on one machine, where a partition between Sentinels cannot happen.
With three, as a deployment runs them, two must agree that the primary is
down and a majority elects the one that fails it over.

Given certificates (:mod:`.certificates`), the whole group speaks TLS alone:
the servers and the Sentinels listen on TLS ports only, replicate and talk to
each other over TLS, and :meth:`SentinelGroup.url` is a ``sentinels://`` URL
trusting the CA. The group's own clients (its waits and failover helpers)
connect the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import redis

from dataservice.errors import ServiceSetupError
from dataservice_tools.localservices.certificates import Certificates
from dataservice_tools.localservices.lifecycle import local_redis_url
from dataservice_tools.localservices.probes import binary, free_port, redis_reachable, wait_until
from dataservice_tools.localservices.redisserver import PrivateRedis

# How long the Sentinel waits before it calls an unanswering primary down, and
# how long a failover may take before it is tried again. At 500 ms the Sentinel
# called the new primary down too, while its own link to it was still being
# made (about 0.9 s after the promotion).
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class SentinelGroup:
    """A primary, a replica of it and a Sentinel that watches them, under
    ``directory``; over TLS alone when given ``certificates``."""

    def __init__(
        self,
        directory: Path,
        name: str = "ds-cell",
        sentinels: int = 1,
        certificates: Certificates | None = None,
    ) -> None:
        self.directory = directory
        self.name = name
        self.certificates = certificates
        self.servers = (
            PrivateRedis(directory / "a", certificates=certificates),
            PrivateRedis(directory / "b", certificates=certificates),
        )
        self.sentinel_ports = tuple(free_port() for _ in range(sentinels))
        self.sentinel_port = self.sentinel_ports[0]
        self.quorum = sentinels // 2 + 1

    def url(self, db: int = 0) -> str:
        """The service's URL of the primary (``sentinel://`` with every
        Sentinel; ``sentinels://`` trusting the CA over TLS)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        if self.certificates is None:
            return f"sentinel://{hosts}/{self.name}/{db}"
        ca = quote(str(self.certificates.ca), safe="/")
        return f"sentinels://{hosts}/{self.name}/{db}?ssl_ca_certs={ca}"

    def _client(self, port: int, socket_timeout: float = 1) -> redis.Redis:
        """A client of the server or Sentinel on ``port``, over TLS if the group is."""
        tls: dict[str, Any] = {}
        if self.certificates is not None:
            tls = {"ssl": True, "ssl_ca_certs": str(self.certificates.ca)}
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=socket_timeout, **tls)

    def start(self) -> SentinelGroup:
        primary, replica = self.servers
        primary.start()
        replica.start(extra=("--replicaof", "127.0.0.1", str(primary.port)))
        self._wait_linked(replica)
        for port in self.sentinel_ports:
            self._start_sentinel(port, primary.port)
        if len(self.sentinel_ports) > 1:
            self._wait_acquainted()
        return self

    def _wait_acquainted(self) -> None:
        # A Sentinel learns of the others from their hellos on the primary; a
        # failover needs a majority that knows each other.
        def acquainted() -> bool:
            for port in self.sentinel_ports:
                client = self._client(port)
                try:
                    state = cast("dict[str, Any]", client.sentinel_master(self.name))
                finally:
                    client.close()
                if int(state.get("num-other-sentinels", 0)) < len(self.sentinel_ports) - 1:
                    return False
            return True

        wait_until(acquainted, "the Sentinels to know each other", self._dir(0) / "sentinel.log")

    def _dir(self, index: int) -> Path:
        return self.directory / f"sentinel-{index}"

    def _wait_linked(self, replica: PrivateRedis) -> None:
        client = self._client(replica.port)
        try:
            wait_until(
                lambda: client.info("replication").get("master_link_status") == "up",
                "the replica's link to its primary",
                replica.directory / "redis" / "redis.log",
            )
        finally:
            client.close()

    def _start_sentinel(self, port: int, primary_port: int) -> None:
        directory = self._dir(self.sentinel_ports.index(port))
        directory.mkdir(parents=True, exist_ok=True)
        conf = directory / "sentinel.conf"
        log = directory / "sentinel.log"
        # The Sentinel rewrites this file as it learns: it must be its own, writable.
        conf.write_text(
            "\n".join(
                (
                    *self._listening_conf(port),
                    "bind 127.0.0.1",
                    "daemonize yes",
                    f"pidfile {directory / 'sentinel.pid'}",
                    f"logfile {log}",
                    f"dir {directory}",
                    f"sentinel monitor {self.name} 127.0.0.1 {primary_port} {self.quorum}",
                    f"sentinel down-after-milliseconds {self.name} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {self.name} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {self.name} 1",
                    "",
                )
            )
        )
        subprocess.run([binary("redis-server"), str(conf), "--sentinel"], check=True)
        url = local_redis_url(port, self.certificates)
        wait_until(
            lambda: redis_reachable(url) and self._primary_port_from(port) == primary_port,
            "the Sentinel",
            log,
        )

    def _listening_conf(self, port: int) -> tuple[str, ...]:
        if self.certificates is None:
            return (f"port {port}",)
        # tls-replication: the Sentinel's links to the servers and to the
        # other Sentinels are TLS too; it announces its TLS port.
        return (
            "port 0",
            f"tls-port {port}",
            f"tls-cert-file {self.certificates.server_cert}",
            f"tls-key-file {self.certificates.server_key}",
            f"tls-ca-cert-file {self.certificates.ca}",
            "tls-auth-clients no",
            "tls-replication yes",
        )

    def _sentinel(self, port: int | None = None) -> redis.Redis:
        return self._client(port or self.sentinel_port)

    def primary_port(self) -> int | None:
        """The port of the server the first Sentinel names primary now (None: it names none)."""
        return self._primary_port_from(self.sentinel_port)

    def _primary_port_from(self, port: int) -> int | None:
        client = self._sentinel(port)
        try:
            # redis-py's stubs type Sentinel replies as unions with bool.
            address = cast(
                "tuple[str, int] | None", client.sentinel_get_master_addr_by_name(self.name)
            )
        finally:
            client.close()
        return int(address[1]) if address else None

    def server_on(self, port: int) -> PrivateRedis:
        for server in self.servers:
            if server.port == port:
                return server
        raise ServiceSetupError(f"no server of this group is on port {port}")

    def kill_primary(self) -> PrivateRedis:
        """SIGKILL the primary; returns it (to start again as a replica, or not)."""
        port = self.primary_port()
        if port is None:
            raise ServiceSetupError("the Sentinel names no primary")
        killed = self.server_on(port)
        killed.signal(signal.SIGKILL)
        return killed

    def replica(self) -> PrivateRedis:
        """The server the Sentinel does not name primary."""
        port = self.primary_port()
        others = [server for server in self.servers if server.port != port]
        if len(others) != 1:
            raise ServiceSetupError("the Sentinel names no primary of this group")
        return others[0]

    def wait_replicated(self, timeout_ms: int = 2000) -> None:
        """Wait until the replica has everything the primary has taken so far."""
        port = self.primary_port()
        if port is None:
            raise ServiceSetupError("the Sentinel names no primary")
        primary = self._client(port, socket_timeout=timeout_ms / 1000 + 1)
        try:
            if primary.wait(1, timeout_ms) < 1:
                raise ServiceSetupError(f"the replica did not catch up within {timeout_ms} ms")
        finally:
            primary.close()

    @contextlib.contextmanager
    def replication_held(self) -> Iterator[PrivateRedis]:
        """Inside: the replica stopped (SIGSTOP) and its link to the primary
        cut, so nothing the primary takes meanwhile reaches it (what was sent
        before, in its socket's buffer, still does). On leaving, the replica
        goes on; it links to the primary again if the primary is still there."""
        replica = self.replica()
        port = self.primary_port()
        if port is None:
            raise ServiceSetupError("the Sentinel names no primary")
        primary = self._client(port)
        replica.signal(signal.SIGSTOP)
        try:
            primary.client_kill_filter(_type="replica")
            yield replica
        finally:
            primary.close()
            replica.signal(signal.SIGCONT)

    @contextlib.contextmanager
    def sentinels_stopped(self) -> Iterator[None]:
        """Inside: every Sentinel stopped (SIGSTOP), so that a question to one
        is taken by its socket and never answered; on leaving, they go on."""
        pids = [
            int((self._dir(i) / "sentinel.pid").read_text())
            for i in range(len(self.sentinel_ports))
        ]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)

    def wait_promoted(self, old_port: int, timeout_s: float = 15.0) -> int:
        """Wait until the Sentinel names a primary other than ``old_port`` and
        has settled on it (its flags say only ``master``: linked, not down, no
        failover in progress); returns its port."""
        deadline = time.monotonic() + timeout_s
        client = self._sentinel()
        try:
            while time.monotonic() < deadline:
                state = cast("dict[str, Any]", client.sentinel_master(self.name))
                flags = state.get("flags", "")
                names = set(flags.split(",")) if isinstance(flags, str) else set(flags)
                port = int(state["port"])
                if port != old_port and names == {"master"}:
                    return port
                time.sleep(0.02)
        finally:
            client.close()
        raise ServiceSetupError(f"the Sentinel settled on no new primary within {timeout_s} s")

    def stop(self) -> None:
        # Whatever was never started, or is gone already, has nothing to stop.
        for index in range(len(self.sentinel_ports)):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((self._dir(index) / "sentinel.pid").read_text()), signal.SIGKILL)
        for server in self.servers:
            with contextlib.suppress(OSError, ValueError):
                server.signal(signal.SIGKILL)

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

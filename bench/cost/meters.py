"""What an interval cost: the Redis commands run (``INFO commandstats``), the
data segments each process sent to Redis (``ss -tinp``), and the CPU of Redis
(``INFO cpu``), of this process, of the workers and of mariadbd (``/proc``).

A :class:`Meter` takes a :class:`Reading` before and after an interval;
:meth:`Meter.delta` is what the interval cost, and :meth:`Delta.net` that less
an idle interval's share, scaled to the same length. :func:`check_methods`
verifies on the Redis at hand what the counts rest on.

Redis's counters are the server's, every db's (the bench runs a redis-server
of its own unless told to use another): another process using the same Redis
is counted too. Its segments show as the ``other`` side, and the report says
so.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

import redis
from dataservice_tools.testkit.cpu import process_cpu_s

CALLER = "caller"
INTERACTIVE = "interactive worker"
BATCH = "batch worker"
OTHER = "other"
SIDES = (CALLER, INTERACTIVE, BATCH, OTHER)
CPU_PARTS = (CALLER, INTERACTIVE, BATCH, "redis", "mariadb")
# The meter's own command, once per interval (the INFO that ends one reading
# is counted by the next; the one that starts the interval, in the interval).
OWN_COMMAND = "info"
# A sequential run of this many GETs, then a pipeline of as many: what the
# segment count is checked against.
CHECK_COMMANDS = 50

_PID = re.compile(r"\bpid=(\d+)")
_FIELD = re.compile(r"\b(data_segs_out|bytes_sent):(\d+)")


@dataclass(frozen=True, slots=True)
class Sent:
    """One socket to Redis: its owner (None when ``ss`` cannot see it: another
    user's), and the data segments and bytes it has sent."""

    pid: int | None
    segments: int
    bytes_sent: int


def redis_sockets(port: int) -> dict[int, Sent]:
    """Every established TCP socket on this machine whose peer port is
    ``port``, by its local port."""
    listing = subprocess.run(
        ["ss", "-tinpH", "state", "established", f"dport = :{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict[int, Sent] = {}
    local: int | None = None
    pid: int | None = None
    for line in listing.splitlines():
        if not line[:1].isspace():
            # ``Recv-Q Send-Q Local Peer Process``; the TCP info follows, indented.
            columns = line.split()
            local = int(columns[2].rsplit(":", 1)[1])
            owner = _PID.search(line)
            pid = int(owner.group(1)) if owner else None
            continue
        if local is None:
            continue
        # ss leaves a counter out while it is 0.
        fields = {name: int(value) for name, value in _FIELD.findall(line)}
        found[local] = Sent(pid, fields.get("data_segs_out", 0), fields.get("bytes_sent", 0))
        local = None
    return found


def listening_pid(port: int) -> int | None:
    """The process listening on ``port`` on this machine (several mariadbd may
    run, each on a port of its own), None if ``ss`` cannot see one."""
    listing = subprocess.run(
        ["ss", "-tlnpH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    owner = _PID.search(listing)
    return int(owner.group(1)) if owner else None


def local_port(client: redis.Redis) -> int:
    """The local port of ``client``'s connection, as Redis sees it."""
    return int(str(client.client_info()["addr"]).rsplit(":", 1)[1])


@dataclass(frozen=True)
class Reading:
    at: float
    cpu_s: dict[str, float | None]
    commands: dict[str, int]
    sockets: dict[int, Sent]


@dataclass
class Delta:
    """What an interval cost, or (after :meth:`net`) a share of it."""

    seconds: float
    cpu_s: dict[str, float | None]
    commands: dict[str, float]
    segments: dict[str, float]
    bytes_sent: dict[str, float]
    # Sockets open at the start and gone at the end: what they sent in between is lost.
    closed: int = 0
    opened: int = 0

    def net(self, idle: Delta) -> Delta:
        """This interval less ``idle``'s traffic and CPU over as long."""
        share = self.seconds / idle.seconds if idle.seconds else 0.0

        def less(busy: Mapping[str, float], quiet: Mapping[str, float]) -> dict[str, float]:
            return {k: busy.get(k, 0) - share * quiet.get(k, 0) for k in {*busy, *quiet}}

        cpu: dict[str, float | None] = {}
        for part, used in self.cpu_s.items():
            quiet = idle.cpu_s.get(part)
            cpu[part] = None if used is None or quiet is None else used - share * quiet
        return Delta(
            self.seconds,
            cpu,
            less(self.commands, idle.commands),
            less(self.segments, idle.segments),
            less(self.bytes_sent, idle.bytes_sent),
            self.closed,
            self.opened,
        )


class Meter:
    """Readings of one Redis server, the bench's processes and mariadbd.

    ``pids`` names the sides: this process is the caller, the others by their
    pid; every other socket to Redis is ``other``. The meter's own connection is
    none of them.
    """

    def __init__(self, url: str, pids: Mapping[str, int], mariadb_pid: int | None) -> None:
        self._redis = redis.Redis.from_url(url, single_connection_client=True)
        self._port = int(self._redis.connection_pool.connection_kwargs.get("port", 6379))
        self._own = local_port(self._redis)
        self._sides = {pid: side for side, pid in pids.items()} | {os.getpid(): CALLER}
        self._pids = dict(pids)
        self._mariadb = mariadb_pid

    def close(self) -> None:
        self._redis.close()

    def side(self, local: int, sent: Sent) -> str | None:
        """The side a socket is on; None for the meter's own."""
        if local == self._own:
            return None
        return self._sides.get(sent.pid, OTHER) if sent.pid is not None else OTHER

    def sockets(self) -> dict[int, Sent]:
        return redis_sockets(self._port)

    def read(self) -> Reading:
        sockets = self.sockets()
        info = self._redis.info("commandstats", "cpu")
        cpu: dict[str, float | None] = {
            CALLER: time.process_time(),
            **{side: process_cpu_s(pid) for side, pid in self._pids.items()},
            "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            "mariadb": process_cpu_s(self._mariadb) if self._mariadb else None,
        }
        commands = {
            name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in info.items()
            if name.startswith("cmdstat_")
        }
        return Reading(time.monotonic(), cpu, commands, sockets)

    def delta(self, before: Reading, after: Reading) -> Delta:
        commands: dict[str, float] = {
            name: calls - before.commands.get(name, 0)
            for name, calls in after.commands.items()
            if calls != before.commands.get(name, 0)
        }
        commands[OWN_COMMAND] = commands.get(OWN_COMMAND, 0) - 1
        if not commands[OWN_COMMAND]:
            del commands[OWN_COMMAND]
        segments = dict.fromkeys(SIDES, 0.0)
        sent = dict.fromkeys(SIDES, 0.0)
        for local, now in after.sockets.items():
            side = self.side(local, now)
            if side is None:
                continue
            was = before.sockets.get(local)
            # A socket opened in the interval sent all it counts in it.
            segments[side] += now.segments - (was.segments if was else 0)
            sent[side] += now.bytes_sent - (was.bytes_sent if was else 0)
        cpu: dict[str, float | None] = {}
        for part, used in after.cpu_s.items():
            start = before.cpu_s.get(part)
            cpu[part] = None if used is None or start is None else used - start
        return Delta(
            after.at - before.at,
            cpu,
            commands,
            segments,
            sent,
            closed=len(before.sockets.keys() - after.sockets.keys()),
            opened=len(after.sockets.keys() - before.sockets.keys()),
        )


def check_methods(url: str) -> dict[str, object]:
    """What the counts rest on, on this Redis: that the commands a script calls
    are counted in ``INFO commandstats`` beside the script's own entry, and that
    a command sent alone adds one data segment to its socket and a pipeline of
    many, one in all."""
    # One connection in its pool, which every command and the pipeline take in
    # turn (a single-connection client would send its pipelines on another).
    client = redis.Redis(
        connection_pool=redis.BlockingConnectionPool.from_url(url, max_connections=1)
    )
    port = int(client.connection_pool.connection_kwargs.get("port", 6379))
    key, counter = "cost:check:key", "cost:check:counter"
    try:
        own = local_port(client)

        def calls() -> dict[str, int]:
            info = client.info("commandstats")
            return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in info.items()}

        before = calls()
        client.eval(
            "redis.call('SET', KEYS[1], 'x'); redis.call('GET', KEYS[1]);"
            " redis.call('GET', KEYS[1]); return redis.call('INCR', KEYS[2])",
            2,
            key,
            counter,
        )
        after = calls()
        scripted = {
            name: after.get(name, 0) - before.get(name, 0)
            for name in ("eval", "set", "get", "incr")
        }

        def segments() -> int:
            return redis_sockets(port)[own].segments

        start = segments()
        for _ in range(CHECK_COMMANDS):
            client.get(key)
        alone = segments() - start
        start = segments()
        pipe = client.pipeline(transaction=False)
        for _ in range(CHECK_COMMANDS):
            pipe.get(key)
        pipe.execute()
        pipelined = segments() - start
        client.delete(key, counter)
    finally:
        client.connection_pool.disconnect()
    return {
        "script_calls_counted": scripted == {"eval": 1, "set": 1, "get": 2, "incr": 1},
        "script_calls": scripted,
        "commands": CHECK_COMMANDS,
        "segments_sent_alone": alone,
        "segments_pipelined": pipelined,
        "segments_hold": alone == CHECK_COMMANDS and pipelined == 1,
    }

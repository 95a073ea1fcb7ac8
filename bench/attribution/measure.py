"""What one cell of the attribution bench measures, and how.

- **Load**: an open loop (:class:`~dataservice_tools.loadtest.openloop.OpenLoop`):
  arrivals at evenly spaced instants of a fixed rate, whatever the answers do,
  so every system is offered the same load; latency is the caller's wall time
  from sending to the decoded answer.
- **CPU per completed operation**: user + system time from ``/proc`` of this
  process (the callers), the system's worker process, ``redis-server`` and
  ``mariadbd`` over each round of the loop, summed over a cell's rounds and
  divided by the calls answered in them.
- **Redis traffic and commands per operation**: ``INFO stats`` deltas of the
  bench's own redis-server (bytes in and out, commands, Lua's included).
- **Message sizes**: a few sequential calls with ``MONITOR`` on, before the
  loop: the message each system pushes onto its queue (as stored, and its
  task body) and the answer it leaves for its caller, as Redis received them.
- **Caller allocation per operation**: a few more sequential calls under
  ``tracemalloc``: the peak of memory allocated during a call above what was
  live before it (a high-water mark, not a running total of allocations).
- **Worker memory**: its ``VmRSS`` after the loop and ``VmHWM`` (peak) so far.

Neither capture runs during the loop: both slow the caller down.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import statistics
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from dataservice_tools.loadtest.openloop import OpenLoop, Outcome, RequestRecord
from dataservice_tools.testkit.cpu import process_cpu_s
from dataservice_tools.testkit.series import percentile

from bench.attribution.callers import CellAdapter
from dataservice.enums import LaneName

LANE = LaneName.INTERACTIVE
CPU_PARTS = ("caller", "worker", "redis", "mariadb")
_MONITOR_LINE = re.compile(rb"^\+[\d.]+ \[(\d+) ([^\]]*)\] (.*)$", re.DOTALL)
_QUOTED = re.compile(rb'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


@dataclass(frozen=True)
class Probes:
    """The processes whose CPU is counted, and the bench's redis-server."""

    redis: redis.Redis
    redis_pid: int | None
    mariadb_pid: int | None

    def cpu(self, worker_pid: int) -> dict[str, float | None]:
        return {
            "caller": time.process_time(),
            "worker": process_cpu_s(worker_pid),
            "redis": process_cpu_s(self.redis_pid) if self.redis_pid else None,
            "mariadb": process_cpu_s(self.mariadb_pid) if self.mariadb_pid else None,
        }

    def redis_stats(self) -> dict[str, int]:
        info = self.redis.info("stats")
        names = ("total_net_input_bytes", "total_net_output_bytes", "total_commands_processed")
        return {name: int(info[name]) for name in names}


def idle_cpu_ms_per_s(pid: int, seconds: float) -> float | None:
    """``pid``'s CPU ms per second over ``seconds`` of this process sleeping."""
    before = process_cpu_s(pid)
    time.sleep(seconds)
    after = process_cpu_s(pid)
    return None if before is None or after is None else (after - before) * 1000 / seconds


def memory_mb(pid: int) -> dict[str, float | None]:
    """``VmRSS`` and ``VmHWM`` of ``pid``, in MB."""
    found: dict[str, float | None] = {"rss_mb": None, "hwm_mb": None}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found["rss_mb" if name == "VmRSS" else "hwm_mb"] = int(value.split()[0]) / 1024
    return found


@dataclass
class Round:
    """One stretch of the open loop: its calls, and the CPU and Redis work they took."""

    records: list[RequestRecord]
    lagged: int
    cpu_s: dict[str, float | None]
    redis: dict[str, int]


def run_round(
    adapter: CellAdapter,
    ids: list[str],
    rate: float,
    seconds: float,
    timeout_s: float,
    probes: Probes,
    worker_pid: int,
) -> Round:
    """The open loop at ``rate``/s for ``seconds``, until every call is answered."""
    loop = OpenLoop(
        adapter,
        lambda _lane, _t: rate,
        {LANE: timeout_s},
        ids,
        b"",
        seconds,
        time.monotonic() + 0.2,
        max_callers=64,
        read_share={LANE: 1.0},
    )
    cpu_before, stats_before = probes.cpu(worker_pid), probes.redis_stats()
    loop.start(8)
    loop.join()
    cpu_after, stats_after = probes.cpu(worker_pid), probes.redis_stats()
    cpu: dict[str, float | None] = {}
    for part in CPU_PARTS:
        before, after = cpu_before[part], cpu_after[part]
        cpu[part] = None if before is None or after is None else after - before
    redis_delta = {k: stats_after[k] - stats_before[k] for k in stats_before}
    return Round(loop.records, loop.lagged, cpu, redis_delta)


def summarize(rounds: list[Round]) -> dict[str, Any]:
    """A cell's figures over its rounds: latency of every call answered, and
    each cost summed over the rounds, per call answered."""
    records = [r for one in rounds for r in one.records]
    ok_ms = sorted(r.latency_ms for r in records if r.outcome is Outcome.OK)
    done = len(ok_ms)
    failed = [r for r in records if r.outcome is not Outcome.OK]
    cpu: dict[str, float | None] = {}
    for part in CPU_PARTS:
        spent = [one.cpu_s[part] for one in rounds]
        ok = done and all(x is not None for x in spent)
        cpu[part] = sum(x for x in spent if x is not None) * 1000 / done if ok else None
    cpu["total"] = sum(v for v in cpu.values() if v is not None) if done else None

    def per_op(name: str) -> float | None:
        return sum(one.redis[name] for one in rounds) / done if done else None

    return {
        "sent": len(records),
        "ok": done,
        "errors": len(failed),
        "first_error": f"{failed[0].outcome.value}: {failed[0].detail}" if failed else None,
        "lagged": sum(one.lagged for one in rounds),
        "p50_ms": percentile(ok_ms, 50) if ok_ms else None,
        "p99_ms": percentile(ok_ms, 99) if ok_ms else None,
        "mean_ms": statistics.fmean(ok_ms) if ok_ms else None,
        "latencies_ms": [round(x, 3) for x in ok_ms],
        "cpu_ms_per_op": cpu,
        "redis_in_bytes_per_op": per_op("total_net_input_bytes"),
        "redis_out_bytes_per_op": per_op("total_net_output_bytes"),
        "redis_commands_per_op": per_op("total_commands_processed"),
    }


def caller_allocations(adapter: CellAdapter, ids: list[str], timeout_s: float) -> float:
    """The median peak of memory a call allocates in this process, in bytes."""
    peaks = []
    tracemalloc.start()
    try:
        for object_id in ids:
            tracemalloc.reset_peak()
            live = tracemalloc.get_traced_memory()[0]
            adapter.read(object_id, timeout_s)
            peaks.append(tracemalloc.get_traced_memory()[1] - live)
    finally:
        tracemalloc.stop()
    return statistics.median(peaks)


class Monitor:
    """``MONITOR`` on a connection of its own, collected by a thread until stopped."""

    def __init__(self, host: str, port: int) -> None:
        self._sock = socket.create_connection((host, port), timeout=2)
        self._sock.sendall(b"MONITOR\r\n")
        # Only commands after the server's OK are shown: the calls wait for it.
        reply = b""
        while b"\r\n" not in reply:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise ConnectionError("redis-server closed the MONITOR connection")
            reply += chunk
        self._chunks: list[bytes] = [reply.partition(b"\r\n")[2]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._collect, name="monitor", daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        self._sock.settimeout(0.05)
        while not self._stop.is_set():
            try:
                chunk = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                return
            self._chunks.append(chunk)

    def stop(self) -> list[tuple[int, list[bytes]]]:
        """Every command seen: its db and its arguments, unescaped."""
        # What was sent just before is on its way to this connection.
        time.sleep(0.1)
        self._stop.set()
        self._thread.join()
        self._sock.close()
        commands = []
        for line in b"".join(self._chunks).split(b"\r\n"):
            matched = _MONITOR_LINE.match(line)
            if matched is None:
                continue
            args = [_unescape(arg) for arg in _QUOTED.findall(matched.group(3))]
            if args:
                commands.append((int(matched.group(1)), args))
        return commands


def _unescape(arg: bytes) -> bytes:
    """An argument as ``MONITOR`` prints it (``sdscatrepr``) back to its bytes."""

    def one(match: re.Match[bytes]) -> bytes:
        code = match.group(1)
        if code[:1] == b"x" and len(code) == 3:
            return bytes([int(code[1:], 16)])
        return _ESCAPES.get(code, code)

    return _ESCAPE.sub(one, arg)


def message_sizes(
    adapter: CellAdapter, ids: list[str], timeout_s: float, port: int, db: int, queue: str
) -> dict[str, float | None]:
    """What the calls put on the wire, as Redis received it (medians over the calls)."""
    monitor = Monitor("127.0.0.1", port)
    try:
        for object_id in ids:
            adapter.read(object_id, timeout_s)
    finally:
        commands = monitor.stop()
    messages, answers = [], []
    for command_db, args in commands:
        name = args[0].upper()
        if command_db != db or len(args) < 3:
            continue
        if name == b"LPUSH" and args[1] == queue.encode():
            messages.append(args[-1])
        elif name == b"RPUSH" and args[1].startswith((b"ds:result:", b"ds:reply:")):
            answers.append(len(args[2]))
        elif name == b"SETEX" and args[1].startswith(b"celery-task-meta-") and len(args) > 3:
            answers.append(len(args[3]))
    bodies = [len(base64.b64decode(json.loads(m)["body"])) for m in messages]

    def median(values: list[int]) -> float | None:
        return statistics.median(values) if values else None

    return {
        "request_message_bytes": median([len(m) for m in messages]),
        "request_body_bytes": median(bodies),
        "response_bytes": median(answers),
    }

"""The database sampler's process: ``python -m dataservice_tools.loadtest.probe
--user USER --interval S --read-timeout N``, the server's address as JSON on
stdin (a password never shows in the process list).

Every tick reads, in one round trip, ``information_schema.PROCESSLIST`` for
``USER`` and its ``TOTAL_CONNECTIONS`` from ``USER_STATISTICS``, and prints
one line of JSON: ``at`` (the ``CLOCK_MONOTONIC`` time the answer arrived),
``connections``, ``active`` (``COMMAND = 'Query'``), ``opened`` (connections
opened since the probe began, carried across a restart of the server) and
``states`` (the active statements' server states); ``{"gap": true}`` when it
lost the server, ``{"error": ...}`` when it could not reach it at all. It
imports nothing but the driver, so it samples within a moment of its start.
The harness's side is :mod:`.sampler`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from typing import IO, Any

import MySQLdb

# Connecting to a server that refuses, try again this often.
RECONNECT_S = 0.2
# A stalled server must cost the sampler a gap, not its process (whole
# seconds: the driver takes no less).
READ_TIMEOUT_S = 2

# The processes (kind "p": command, state) and the total (kind "t": in the
# command's column) in one statement, one snapshot as near as the server gives.
_SNAPSHOT = (
    "SELECT 'p', COMMAND, STATE FROM information_schema.PROCESSLIST WHERE USER = %s "
    "UNION ALL "
    "SELECT 't', TOTAL_CONNECTIONS, NULL FROM information_schema.USER_STATISTICS WHERE USER = %s"
)


def connect(address: dict[str, Any], read_timeout_s: int = READ_TIMEOUT_S) -> Any:
    """A connection to the server at ``address`` (host, port, user, password)."""
    return MySQLdb.connect(
        **address,
        autocommit=True,
        connect_timeout=2,
        read_timeout=read_timeout_s,
        write_timeout=read_timeout_s,
    )


class Probe:
    """The sampling loop: one JSON line to ``out`` per sample, or per gap, or
    the error that ended it.

    A lost connection is replaced at once (the moment the server is back is
    the one to see); a failed attempt to connect is tried again
    ``RECONNECT_S`` after it began (an attempt a stalled server left waiting
    for its greeting has waited long enough already)."""

    def __init__(
        self,
        address: dict[str, Any],
        user: str,
        interval_s: float,
        read_timeout_s: int,
        out: IO[str],
    ) -> None:
        self.address, self.user, self.out = address, user, out
        self.interval_s, self.read_timeout_s = interval_s, read_timeout_s
        self._last = self._next = time.monotonic()

    def _print(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def _snapshot(self, cursor: Any) -> tuple[list[tuple[str, str | None]], int]:
        """The user's processes (command, state) and its connections opened so far."""
        cursor.execute(_SNAPSHOT, (self.user, self.user))
        processes: list[tuple[str, str | None]] = []
        total = 0
        for kind, command, state in cursor.fetchall():
            if kind == "p":
                processes.append((str(command), state))
            else:
                total = int(command)
        return processes, total

    def run(self) -> None:
        """Sample until ended; a lost server (a fault run stops or restarts it)
        leaves a gap and a reconnection, its totals carried across a restart."""
        connected = False
        base = carried = opened = 0
        while True:
            attempt = time.monotonic()
            try:
                conn = connect(self.address, self.read_timeout_s)
            except MySQLdb.Error as exc:
                if not connected:
                    self._print({"error": f"sampler cannot connect: {type(exc).__name__}"})
                    return
                time.sleep(max(0.0, RECONNECT_S - (time.monotonic() - attempt)))
                continue
            try:
                cursor = conn.cursor()
                if not connected:
                    base, carried = self._snapshot(cursor)[1], 0
                elif self._restarted(cursor):
                    # It counts its connections from zero again.
                    base, carried = 0, opened
                connected = True
                while True:
                    opened = self._sample(cursor, base, carried)
            except MySQLdb.Error:
                self._print({"gap": True})
            finally:
                conn.close()

    def _restarted(self, cursor: Any) -> bool:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
        row = cursor.fetchone()
        return row is not None and int(row[1]) <= time.monotonic() - self._last + 1

    def _sample(self, cursor: Any, base: int, carried: int) -> int:
        """One sample, then the wait for the next tick; the connections opened
        so far (``carried``: those counted before this connection)."""
        processes, total = self._snapshot(cursor)
        self._last = now = time.monotonic()
        opened = carried + total - base
        states = Counter(str(state or "-") for command, state in processes if command == "Query")
        self._print(
            {
                "at": now,
                "connections": len(processes),
                "active": sum(states.values()),
                "opened": opened,
                "states": states,
            }
        )
        self._next += self.interval_s
        delay = self._next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            # Behind (a busy machine, a stalled server): sample again at once, do not bunch up.
            self._next = time.monotonic()
        return opened


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--user", required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--read-timeout", type=int, default=READ_TIMEOUT_S)
    args = parser.parse_args(argv)
    address = json.loads(sys.stdin.readline())
    Probe(address, args.user, args.interval, args.read_timeout, sys.stdout).run()


if __name__ == "__main__":
    # Ended by the harness (SIGTERM), or by its going away (a closed pipe).
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        main()

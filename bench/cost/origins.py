"""Where each command comes from: sent by a process (top-level: the caller's or
a worker's) or called inside a script, from ``MONITOR`` over a short sample of
requests.

``INFO commandstats`` counts a command a script calls under its own name beside
the script's ``EVALSHA`` and cannot tell the two apart; ``MONITOR`` shows each
command with the connection that sent it, and a script's own calls with
``lua`` for their client. ``MONITOR`` slows Redis down, so the sample is
apart from the measured intervals and only its proportions are used.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from bench.cost.meters import OTHER, Meter

SCRIPT = "script"
# Commands whose name is their first two words in INFO commandstats.
_CONTAINERS = frozenset(
    {"acl", "client", "cluster", "command", "config", "function", "memory", "object", "script"}
    | {"xgroup", "xinfo"}
)
_MARKER = "cost-bench-sample-over"


def stat_name(command: str) -> str:
    """``command`` (as ``MONITOR`` shows it) by its INFO commandstats name."""
    words = command.split(maxsplit=2)
    name = words[0].lower()
    if name in _CONTAINERS and len(words) > 1:
        return f"{name}|{words[1].lower()}"
    return name


def sample(url: str, db: int, meter: Meter, run: Callable[[], object]) -> dict[str, Counter[str]]:
    """Every command of ``run()``, by name and origin (a side, or ``script``).

    A process's command counts wherever it was sent (a new connection's
    ``HELLO`` comes before its ``SELECT``); a script's, only in ``db``.
    """
    seen: list[dict[str, Any]] = []
    listening = threading.Event()
    failure: list[BaseException] = []

    def listen() -> None:
        try:
            # redis-py leaves ``monitor`` untyped.
            opened: Callable[[], Any] = redis.Redis.from_url(url).monitor
            with opened() as monitor:
                listening.set()
                while True:
                    command = monitor.next_command()
                    if command["command"] == f"ECHO {_MARKER}":
                        return
                    seen.append(command)
        except BaseException as exc:
            failure.append(exc)
            listening.set()

    # Connected before the monitor starts, so that its set-up is not seen.
    marker = redis.Redis.from_url(url, single_connection_client=True)
    listener = threading.Thread(target=listen, name="monitor", daemon=True)
    try:
        marker.ping()
        listener.start()
        listening.wait()
        if failure:
            raise failure[0]
        sides = meter.sockets()
        run()
        sides |= meter.sockets()
    finally:
        # Ends the listener, whatever happened to the sample.
        marker.echo(_MARKER)
        marker.close()
        if listener.is_alive():
            listener.join(timeout=30)
    if failure:
        raise failure[0]
    by_name: dict[str, Counter[str]] = {}
    for command in seen:
        if command["client_type"] == "lua":
            if command["db"] != db:
                continue
            origin = SCRIPT
        else:
            port = int(command["client_port"] or 0)
            found = sides.get(port)
            origin = (meter.side(port, found) if found else OTHER) or OTHER
        by_name.setdefault(stat_name(command["command"]), Counter())[origin] += 1
    return by_name

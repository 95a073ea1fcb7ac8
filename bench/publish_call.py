"""The publish interface against the publish it replaced: Redis's CPU, the caller's.

    .venv/bin/python bench/publish_call.py [--requests 20000] [--rounds 3] [--body 300]
                                           [--json out.json]

A caller on Redis publishes a request with ``FCALL ds_publish_v2``
(``dataservice/broker/publish.lua``): the caller sends the signed request in
base64, the message kombu's Redis transport stores is built in Redis around
it, and admission (``admit.lua``) runs on it in the same call. Before, the
caller built that message itself (Celery's task message and its JSON) and ran
``admit.lua`` with it by ``EVALSHA``. This
bench runs both, on a redis-server of its own (a free port, nothing shared),
one caller thread, ``--requests`` interactive reads of a ``--body``-byte
signed request each way per round, the two ways alternating for ``--rounds``
rounds, and reports per publish:

- **Redis CPU** (``INFO cpu``, user + system, before and after);
- **caller CPU** (``time.process_time``: building the call, sending it,
  reading the answer);
- **bytes to Redis** (``INFO stats`` ``total_net_input_bytes``);
- **Redis commands** (``INFO commandstats``: the call and what it runs);

and the interface's ratio to the old way for each, in the same run. The
lanes' bounds are raised so that nothing is refused: every publish is
admitted and pushed, as a request a worker would take.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.machine import host
from rich.console import Console
from rich.table import Table

from bench import _env
from dataservice.broker import library
from dataservice.broker.base import Request
from dataservice.broker.message import request_message
from dataservice.compat.kombu import queue_entry
from dataservice.config.model import Config, load_config
from dataservice.enums import LaneName
from dataservice.limits.admission import (
    ADMIT,
    SIZE_HEADER,
    admit_call,
    admitted,
    caller_pacing,
    envelope_size,
    lane_admission_bounds,
)
from dataservice.limits.pacing import Pacing

CALLER = _env.CALLER
WAYS = ("EVALSHA admit.lua (before)", "FCALL ds_publish_v2")
# The commandstats entries of the two ways' one command each.
PUBLISH_COMMANDS = ("cmdstat_evalsha", "cmdstat_fcall")


def unbounded(config: Config) -> Config:
    """``config`` with lanes that hold every request this bench sends."""
    lanes = {}
    for lane in LaneName:
        lane_config = config.lanes[lane]
        admission = lane_config.admission.model_copy(
            update={"max_messages": 10_000_000, "max_bytes": 1 << 40, "target_wait_ms": None}
        )
        lanes[lane.value] = lane_config.model_copy(update={"admission": admission})
    return config.model_copy(update={"lanes": config.lanes.model_copy(update=lanes)})


def _figures(client: redis.Redis) -> dict[str, float]:
    cpu = client.info("cpu")
    stats = client.info("stats")
    commands = client.info("commandstats")
    return {
        "redis_cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        "bytes_in": float(stats["total_net_input_bytes"]),
        "commands": float(sum(int(c["calls"]) for c in commands.values())),
        # Redis's own timing of the publish command, the calls it makes
        # included: the script's work without the network's.
        "publish_usec": float(
            sum(int(commands.get(name, {}).get("usec", 0)) for name in PUBLISH_COMMANDS)
        ),
    }


def run_way(
    way: str, client: redis.Redis, config: Config, requests: int, body: bytes
) -> dict[str, float]:
    """``requests`` publishes one way; the figures per publish."""
    queue = config.lanes.interactive.queue
    bounds = lane_admission_bounds(config)[queue]
    pacing = Pacing(caller_pacing(config))
    deadline = int((time.time() + 3600) * 1000)
    ids = [uuid.uuid4().hex for _ in range(requests)]
    before = _figures(client)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if way == WAYS[0]:
        for request_id in ids:
            request = Request(LaneName.INTERACTIVE, queue, body, request_id, CALLER, deadline,
                              "read", 1, "bench")  # fmt: skip
            message = request_message(request)
            message["headers"][SIZE_HEADER] = envelope_size(message)
            keys, args = admit_call(queue, bounds, queue_entry(message), message, pacing)
            admitted(ADMIT(client, keys, args), pacing, CALLER)
    else:
        for request_id in ids:
            step = pacing.step(CALLER, 1)
            lease = -1 if step is None else step.lease
            args = library.publish_args(
                LaneName.INTERACTIVE, request_id, CALLER, deadline, "read", 1, body, lease
            )
            admitted(library.publish(client, args, config), pacing, CALLER)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    after = _figures(client)
    # The figures' own INFO commands (three before, three after) are not the publishes'.
    return {
        "redis_cpu_us": (after["redis_cpu_s"] - before["redis_cpu_s"]) * 1e6 / requests,
        "caller_cpu_us": cpu * 1e6 / requests,
        "wall_us": wall * 1e6 / requests,
        "bytes_in": (after["bytes_in"] - before["bytes_in"]) / requests,
        "commands": (after["commands"] - before["commands"] - 3) / requests,
        "publish_us": (after["publish_usec"] - before["publish_usec"]) / requests,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body", type=int, default=300, help="signed request bytes")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    config = unbounded(load_config(_env.REPO / "queues.yml"))
    body = bytes(range(256)) * (options.body // 256) + bytes(options.body % 256)
    console = Console()
    console.print(host())
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="ds-publish-call-") as directory:
        server = PrivateRedis(Path(directory) / "redis")
        server.start()
        client = redis.Redis.from_url(server.url)
        try:
            library.install(client, config)
            for way in WAYS:  # warm up: the script and the function loaded, the code paths hot
                run_way(way, client, config, min(2000, options.requests), body)
            for _ in range(options.rounds):
                for way in WAYS:
                    client.flushdb()
                    library.install(client, config)
                    results[way].append(run_way(way, client, config, options.requests, body))
        finally:
            client.close()
            server.signal(9)
    medians = {
        way: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for way, runs in results.items()
    }
    table = Table(title=f"per publish, median of {options.rounds} rounds of {options.requests}")
    table.add_column("")
    for way in WAYS:
        table.add_column(way, justify="right")
    table.add_column("ratio", justify="right")
    for key, label in (
        ("redis_cpu_us", "Redis CPU (µs)"),
        ("publish_us", "in the command (µs)"),
        ("caller_cpu_us", "caller CPU (µs)"),
        ("wall_us", "wall (µs)"),
        ("bytes_in", "bytes to Redis"),
        ("commands", "Redis commands"),
    ):
        old, new = medians[WAYS[0]][key], medians[WAYS[1]][key]
        table.add_row(label, f"{old:.1f}", f"{new:.1f}", f"{new / old:.2f}x" if old else "-")
    console.print(table)
    if options.json:
        report: dict[str, Any] = {"options": vars(options) | {"json": str(options.json)},
                                  "rounds": results, "medians": medians}  # fmt: skip
        options.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

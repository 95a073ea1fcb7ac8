"""The sync client's own CPU per cached read, piece by piece.

``python -m bench.caller_cpu`` starts a worker as :mod:`bench.roundtrip` does
(the service alone, its records seeded and cached), then:

- times each piece of a call in this process, one thread, a fixed number of
  loops each (µs per call): the envelope built, signed, the publisher's whole
  share (envelope, signature, pace, throttle), the message's headers and
  kombu's message, its JSON, the reply channel's hand-over (a slot made,
  filled, signalled, waited on and taken) and the answer's decoding;
- runs whole calls one after another against the worker, reading this
  process's CPU (all threads) and the calling thread's around each, and the
  calling thread's inside the publish and inside the admission call (the
  size header, the JSON and the EVALSHA, its system calls included). What
  the process spent beyond the calling thread is the reply channel's reader.

Each piece's timing repeats ``--repeats`` times and keeps the median, so one
noisy repeat does not move it; the whole calls are measured in ``--repeats``
runs too. Every figure is the caller's CPU only (the worker and Redis are in
other processes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from bench import _env
from bench.roundtrip.systems import SCOPE, SERVICE, Bench, parse_args
from dataservice.broker.message import request_headers, task_message
from dataservice.client import Client
from dataservice.client.inbox import request_id_of
from dataservice.codec import decode_response
from dataservice.compat.kombu import queue_entry
from dataservice.enums import LaneName, ReadMode
from dataservice.types import ReadOp

PIECE_LOOPS = 20_000
CALLS = 2_000


def _median_us(run: Callable[[], object], loops: int, repeats: int) -> float:
    """The median over ``repeats`` of the µs per run of ``run``."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            run()
        samples.append((time.perf_counter() - start) / loops * 1e6)
    return statistics.median(samples)


def pieces(
    client: Client, object_id: str, answer: bytes, loops: int, repeats: int
) -> dict[str, float]:
    """Each piece of a call, in this thread, µs per call."""
    publisher = client._publisher
    transport = client._transport
    inbox = transport.replies
    queue = client.config.lanes.interactive.queue
    reply_to = transport._reply_to
    operation = ReadOp(SCOPE, object_id, ReadMode.ALLOW_CACHED)
    deadline = publisher.deadline(LaneName.INTERACTIVE, 5.0)
    envelope = publisher._envelope(operation, deadline, "")
    body = publisher._sign(envelope)
    request_id = envelope.request_id
    headers = request_headers(client.caller, deadline, "read", 1)
    message = task_message(body, request_id, queue, headers, reply_to)
    answer_id = request_id_of(answer)

    def hand_over() -> None:
        inbox.expect(answer_id, 5.0)
        inbox._wake(inbox.slots.hand_over([answer]))
        inbox.wait(answer_id, 1.0)

    figures = {
        "envelope built": lambda: publisher._envelope(operation, deadline, ""),
        "envelope signed": lambda: publisher._sign(envelope),
        "publisher's share (built, signed, paced, throttled)": lambda: publisher.one(
            operation, deadline, ""
        ),
        "message headers": lambda: request_headers(client.caller, deadline, "read", 1),
        "kombu message": lambda: task_message(body, request_id, queue, headers, reply_to),
        "its JSON": lambda: queue_entry(message),
        "reply hand-over (slot, signal, wait, take)": hand_over,
        "answer decoded": lambda: decode_response(answer, answer_id),
    }
    return {name: _median_us(run, loops, repeats) for name, run in figures.items()}


class Meter:
    """The calling thread's CPU inside one wrapped callable, summed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        return timed


def whole_calls(client: Client, ids: list[str], calls: int) -> dict[str, float]:
    """``calls`` reads one after another: CPU per call, µs, and p50 wall ms."""
    transport = client._transport
    publish, admission = Meter(), Meter()
    original_publish, original_admitter = transport.publish_many, transport._broker.admitter

    def admitter(*args: Any) -> Any:
        return admission.wrap(original_admitter(*args))

    transport.publish_many = publish.wrap(original_publish)  # type: ignore[method-assign]
    transport._broker.admitter = admitter  # type: ignore[method-assign]
    walls = []
    try:
        process0, thread0 = time.process_time(), time.thread_time()
        for i in range(calls):
            start = time.perf_counter()
            client.read(SCOPE, ids[i % len(ids)])
            walls.append(time.perf_counter() - start)
        process, thread = time.process_time() - process0, time.thread_time() - thread0
    finally:
        transport.publish_many = original_publish  # type: ignore[method-assign]
        transport._broker.admitter = original_admitter  # type: ignore[method-assign]
    per = 1e6 / calls
    return {
        "caller CPU, all threads": process * per,
        "calling thread": thread * per,
        "of it: the publish": publish.seconds * per,
        "of the publish: the admission call": admission.seconds * per,
        "the reply channel's reader (and other threads)": (process - thread) * per,
        "p50 wall, ms": statistics.median(walls) * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.caller_cpu", description=__doc__)
    p.add_argument("--loops", type=int, default=PIECE_LOOPS, help="loops per piece and repeat")
    p.add_argument("--calls", type=int, default=CALLS, help="whole calls per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    console = Console()
    bench = Bench.create(
        parse_args(
            [
                "--systems",
                SERVICE,
                "--callers",
                "1",
                "--requests",
                "8",
                "--rounds",
                "1",
                "--warmup",
                "50",
                "--records",
                "200",
            ],
            None,
        )
    )
    with _env.sigterm_as_exit():
        try:
            bench.setup()
            bench.stop_callers()
            client = Client(_env.CALLER, bench.settings, bench.config)
            try:
                answers: list[bytes] = []
                take = client._transport.replies.slots.take

                def keep(request_id: str) -> bytes | None:
                    body = take(request_id)
                    if body:
                        answers.append(body)
                    return body

                client._transport.replies.slots.take = keep  # type: ignore[method-assign]
                for object_id in bench.ids[:50]:
                    client.read(SCOPE, object_id)
                client._transport.replies.slots.take = take  # type: ignore[method-assign]
                runs = [whole_calls(client, bench.ids, args.calls) for _ in range(args.repeats)]
                parts = pieces(client, bench.ids[0], answers[-1], args.loops, args.repeats)
            finally:
                client.close()
        finally:
            bench.cleanup()
    calls = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    result = {
        "machine": bench.machine,
        "threads": threading.active_count(),
        "pieces_us": parts,
        "calls": calls,
        "calls_runs": runs,
    }
    console.print("[bold]pieces, µs per call (median of repeats)[/bold]")
    for name, value in parts.items():
        console.print(f"  {name:<55} {value:8.1f}")
    console.print(f"[bold]whole calls, µs per call (median of {args.repeats} runs)[/bold]")
    for name, value in calls.items():
        console.print(f"  {name:<55} {value:8.1f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()

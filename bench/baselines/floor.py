"""A peer of the round trip (``python -m bench.roundtrip``): the least a request
and its answer over Redis can cost, the floor under every queue-based system.

The worker's threads each hold a connection of their own (redis-py with
hiredis) and loop on ``BRPOP`` of the request list, answering each request with
an ``LPUSH`` to the reply list it names. A caller keeps one reply list for its
whole life and sends ``LPUSH`` of its request and ``BLPOP`` of its reply list in
one pipeline, one round trip per call. A request is the reply list's key and
the caller's sequence number; the answer is the number, so that a late answer
to a call that timed out is told apart from the one awaited. No encoding,
acknowledgement or expiry: only what every request and answer over Redis does.

Run the worker with ``python -m bench.baselines.floor --url redis://... --threads N``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import uuid
from types import FrameType

import redis
from redis.utils import HIREDIS_AVAILABLE

REQUESTS = "floor:requests"
REPLY_PREFIX = "floor:reply:"
# How long a worker thread blocks before it looks at the stop flag again.
POLL_S = 1


class Caller:
    """One caller's client and reply list (the bench makes one per caller thread)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._reply = f"{REPLY_PREFIX}{uuid.uuid4().hex}"
        self._sequence = 0

    def call(self, timeout_s: float) -> None:
        """Send a request and wait for its answer; ``TimeoutError`` after ``timeout_s``."""
        self._sequence += 1
        expected = str(self._sequence).encode()
        deadline = time.monotonic() + timeout_s
        # BLPOP's timeout counts in seconds, fractions allowed (Redis 6 and later).
        pipe = self._client.pipeline(transaction=False)
        pipe.lpush(REQUESTS, f"{self._reply} {self._sequence}")
        pipe.blpop([self._reply], timeout=timeout_s)
        _, answer = pipe.execute()
        while answer is not None and answer[1] != expected:
            # A late answer to an earlier call: not this one's.
            answer = self._client.blpop(
                [self._reply], timeout=max(0.01, deadline - time.monotonic())
            )
        if answer is None:
            raise TimeoutError(f"no answer in {timeout_s} s")


def serve(url: str, threads: int) -> None:
    """Answer requests on ``threads`` threads until SIGTERM or SIGINT."""
    if not HIREDIS_AVAILABLE:
        raise SystemExit("hiredis is not installed: the floor is measured with it")
    stop = threading.Event()

    def answer() -> None:
        # A client of its own per thread: one connection, held in BRPOP.
        client = redis.Redis.from_url(url, single_connection_client=True)
        while not stop.is_set():
            request = client.brpop([REQUESTS], timeout=POLL_S)
            if request is not None:
                reply, _, sequence = request[1].partition(b" ")
                client.lpush(reply, sequence)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workers = [threading.Thread(target=answer, name=f"floor-{i}") for i in range(threads)]
    for worker in workers:
        worker.start()
    print(f"floor: {threads} threads answering {REQUESTS} on {url}", file=sys.stderr, flush=True)
    for worker in workers:
        worker.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.floor", description=__doc__)
    parser.add_argument("--url", required=True, help="Redis URL of the request and reply lists")
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)
    serve(args.url, args.threads)


if __name__ == "__main__":
    main()

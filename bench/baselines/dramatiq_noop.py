"""A peer of the round trip (``python -m bench.roundtrip``): a stock Dramatiq
no-op actor on the Redis broker, its result stored by the Results middleware
on the Redis results backend, awaited with
``message.get_result(backend=..., block=True, timeout=...)``, as Dramatiq's
documentation shows.

The worker is the ``dramatiq`` command line with one process and as many
threads as the service's interactive lane (``--processes 1 --threads N``);
everything else is Dramatiq's default (the Redis broker's prefetch of twice the
threads, its polling back-off, its default middleware). The command line forks
its worker process, so the pid it starts under is the parent that only relays
logs; :func:`worker_pids` finds both.

Run the worker with ``python -m bench.baselines.dramatiq_noop --url redis://... --threads N``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

MODULE = "bench.baselines.dramatiq_noop"
ACTOR = "bench_noop"
# The command line imports this module in its forked worker process and takes
# no options for it: the broker's URL reaches it through the environment.
URL_VARIABLE = "BENCH_DRAMATIQ_URL"
# The worker's own shutdown bound, inside the 10 s the bench's stop waits
# before it kills the parent (whose forked worker would then be left running).
SHUTDOWN_TIMEOUT_MS = 5000


def noop() -> None:
    """The actor: nothing."""


class Peer:
    """A broker on ``url`` with the Results middleware, its results backend and
    the no-op actor: what the worker serves and what each caller sends with."""

    def __init__(self, url: str) -> None:
        self.backend = RedisBackend(url=url)
        self.broker = RedisBroker(url=url)
        self.broker.add_middleware(Results(backend=self.backend))
        self.actor = dramatiq.actor(noop, broker=self.broker, actor_name=ACTOR, store_results=True)

    def call(self, timeout_ms: int) -> None:
        """Send the no-op and wait for its result. The backend's blocking wait
        counts in whole seconds (``timeout_ms`` below 1000 does not block)."""
        self.actor.send().get_result(backend=self.backend, block=True, timeout=timeout_ms)

    def close(self) -> None:
        self.broker.close()
        self.backend.client.close()


def setup_worker() -> None:
    """The broker the ``dramatiq`` command line runs (``MODULE:setup_worker``)."""
    dramatiq.set_broker(Peer(os.environ[URL_VARIABLE]).broker)


def worker_pids(pid: int) -> list[int]:
    """``pid`` (the command line's parent process) and its children (read-only
    /proc scan): the CPU a request costs the worker is theirs together."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 of proc(5), after the parenthesised command name.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return [pid, *sorted(children)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--url", required=True, help="Redis URL: broker and results backend")
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)
    command = [
        sys.executable,
        "-m",
        "dramatiq",
        f"{MODULE}:setup_worker",
        "--processes",
        "1",
        "--threads",
        str(args.threads),
        "--worker-shutdown-timeout",
        str(SHUTDOWN_TIMEOUT_MS),
    ]
    # Exec'd, not spawned: the bench's pid is the command line's, and a request
    # to die with the bench survives the exec.
    os.execve(sys.executable, command, {**os.environ, URL_VARIABLE: args.url})


if __name__ == "__main__":
    main()

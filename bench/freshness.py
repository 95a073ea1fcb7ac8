"""Freshness under load: what a reader of ``ALLOW_CACHED`` sees while others write.

    .venv/bin/python bench/freshness.py [--duration 60] [--replicas 3] [--max-lag-s S]
                                        [--json out.json]

Sets everything up itself: a private MariaDB with a binlog (a temporary
directory and a free port) and Redis db ``--redis-db`` (flushed; never 0).
Then it runs ``dataservice loadtest --scenario cached`` (the same run the
command makes: replicas of both lanes at 60 % of their measured capacity,
reads ``ALLOW_CACHED``, writes through the service, direct SQL updates of the
same records at 5 % of the interactive capacity, the change consumer beside
them) three times, with a checker beside each:

- a **probe** reads a random record's revision straight from the database
  (its own connection, as root) at instant A: that revision was committed by A;
- the record is then read through the service with ``ALLOW_CACHED`` at A plus
  each of ``--offsets``, and at A + the bound: ``changes.max_lag_s`` plus
  ``cache.controls_max_age_ms`` (how often a worker looks at the freshness
  guard), 5 s + 1 s with the shipped values;
- a read at A + the bound that returns a lower revision is a **violation**:
  it saw a revision older than one committed more than the bound earlier.

The three runs, at the same offered load:

1. **stream**: the consumer healthy. No violation; the earlier offsets show
   how often the cache is behind right after a commit.
2. **paused**: the consumer is stopped with SIGSTOP from a third of the run to
   two thirds (it holds its lease and its last report, and then wakes), the
   guard on. No violation: the guard must close the cache within the bound.
3. **control**, the baseline: the consumer stopped as the load starts and
   ``changes.guard`` off, so only the service's own writes reach the cache.
   The same checker must find stale reads here: a checker that cannot fail
   proves nothing. The report gives the stale share at the bound in each run.

The run fails (exit 1) on any violation, and also when it could not have
found one: too few reads at the bound (``--min-checks``), a checker thread
that died, a cache hit ratio under 0.5 with the stream, or a control with no
stale read. Each offset's ``latest_start_s`` says how late its reads started.
The runs and the checker are :mod:`dataservice_tools.testkit.freshness`
(``tests/scenarios/test_freshness.py`` runs them at reduced size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from dataservice_tools.testkit import freshness

from bench import _env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--rate", type=float, help="interactive capacity (default: measured)")
    p.add_argument("--probes", type=float, default=20.0, help="probes per second")
    p.add_argument(
        "--offsets", type=float, nargs="*", default=[0.0, 0.05, 0.2, 1.0],
        help="seconds after a probe to read it (bound + 1 s is always added)",
    )  # fmt: skip
    p.add_argument("--redis-db", type=int, default=5, help="flushed before and after; not 0")
    p.add_argument(
        "--out", type=Path, help="the runs' reports (default: .state/bench/freshness/<time>)"
    )
    p.add_argument("--min-checks", type=int, default=100, help="reads at the bound, per phase")
    p.add_argument(
        "--max-lag-s", type=float, help="changes.max_lag_s for the runs (default: queues.yml's)"
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.redis_db == 0:
        p.error("--redis-db must not be 0")
    fields = {k: v for k, v in vars(args).items() if k != "json"}
    fields["offsets"] = tuple(args.offsets)
    fields["out"] = args.out or Path(".state/bench/freshness") / time.strftime("%Y%m%dT%H%M%S")
    options = freshness.Options(base_config=_env.REPO / "queues.yml", **fields)
    result = {
        "command": " ".join(["python", "bench/freshness.py", *sys.argv[1:]]),
        **freshness.run(options),
    }
    print(yaml.safe_dump({k: v for k, v in result.items() if k != "machine"}, sort_keys=False))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for problem in result["problems"]:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())

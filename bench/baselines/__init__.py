"""The stock baselines the benches measure the service against: what a team
using Celery (or Dramatiq) as its documentation shows would run for the same
job, and the floor under them all.

- :mod:`bench.baselines.noop`: a stock Celery no-op task (the round trip's
  baseline: ``python -m bench.roundtrip``, ``bench.fastpath``);
- :mod:`bench.baselines.dramatiq_noop`: a stock Dramatiq no-op actor with its
  result on Redis (a peer in the round trip);
- :mod:`bench.baselines.floor`: a request and its answer over two Redis lists
  and nothing else (the round trip's floor);
- :mod:`bench.baselines.upsert`: a stock Celery task doing the service's upsert
  (the batch writes' baseline: ``python -m bench.batch``).

Each is a worker the bench starts as a subprocess (``python -m bench.baselines.noop
--url ...``): the Celery ones with the options the service's lane runs with,
the others with its concurrency as their threads.
"""

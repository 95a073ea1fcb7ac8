"""The stock baselines the benches measure the service against: what a team
using Celery as its documentation shows would run for the same job.

- :mod:`bench.baselines.noop`: a stock Celery no-op task (the round trip's
  baseline: ``python -m bench.roundtrip``, ``bench.fastpath``);
- :mod:`bench.baselines.upsert`: a stock Celery task doing the service's upsert
  (the batch writes' baseline: ``python -m bench.batch``).

Each is a worker the bench starts as a subprocess (``python -m bench.baselines.noop
--url ...``), with the options the service's lane runs with.
"""

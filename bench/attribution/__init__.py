"""Attribution: the same reads over three request paths, and what each change
moved (``python -m bench.attribution``; :mod:`bench.attribution.__main__` says
what it runs).

- :mod:`~bench.attribution.prepare`: the options, each system's configuration,
  the seeded records and the worker processes;
- :mod:`~bench.attribution.app`: the two composed workers, (a) and (b);
- :mod:`~bench.attribution.wire`: the JSON wire of (a) and (b);
- :mod:`~bench.attribution.callers`: how the callers read through each system;
- :mod:`~bench.attribution.measure`: what one cell measures, and how;
- :mod:`~bench.attribution.fixtures`: serialization and compression in this process;
- :mod:`~bench.attribution.summary`: the mix, the credit of each change, where
  compression pays;
- :mod:`~bench.attribution.report`: the console tables.
"""

"""The interactive read round trip against its peers (a stock Celery no-op, a
stock Dramatiq no-op, the floor of a request and its answer over Redis), same
machine and concurrency: the command (``python -m bench.roundtrip``), what it
sets up and measures (:mod:`bench.roundtrip.systems`), and the same set-up
under py-spy (``python -m bench.roundtrip.profiled``)."""

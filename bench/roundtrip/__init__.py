"""The interactive read round trip against a stock Celery no-op, same broker,
worker options and machine: the command (``python -m bench.roundtrip``), what
it sets up and measures (:mod:`bench.roundtrip.systems`), and the same set-up
under py-spy (``python -m bench.roundtrip.profiled``)."""

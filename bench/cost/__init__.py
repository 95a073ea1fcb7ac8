"""What one request costs Redis, the database and each process, per request
kind: the command (``python -m bench.cost``, :mod:`bench.cost.__main__`), the
kinds (:mod:`bench.cost.kinds`), what an interval cost (:mod:`bench.cost.meters`),
where each command comes from (:mod:`bench.cost.origins`), and the order it all
runs in (:mod:`bench.cost.runner`)."""

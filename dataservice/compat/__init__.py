"""Celery's, kombu's and redis-py's internals, one module per library.

The service leans on names none of these libraries documents (underscore
methods, worker state, the Redis transport's key layout, the points where a
redis-py connection reads its timeouts and packs a command). Each is reached
only through :mod:`dataservice.compat.celery`, :mod:`dataservice.compat.kombu`
or :mod:`dataservice.compat.redis`, whose docstrings list them, and
``tests/compat/test_compat.py`` and ``tests/compat/test_compat_redis.py`` pin every one, so
an upgrade that changes one fails there rather than in a worker. The rest of
the project imports the libraries' public API directly.
"""

"""Celery's and kombu's internals, one module per library.

The service leans on names neither library documents (underscore methods,
worker state, the Redis transport's key layout). Each is reached only
through :mod:`dataservice.compat.celery` or :mod:`dataservice.compat.kombu`,
whose docstrings list them, and ``tests/test_compat.py`` pins every one, so
an upgrade that changes one fails there rather than in a worker. The rest of
the project imports the libraries' public API directly.
"""

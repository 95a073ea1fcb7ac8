"""The change consumer's node: ``celery -A workers.changes worker``.

Without options: one solo pool on the ``changes`` queue (to which nothing is
sent), the consumer on a thread of its own (``docs/changes.md``).
"""

from dataservice.worker.entry import changes_worker_app

app = changes_worker_app()

"""The deployment's way in through Celery's own command line, one app per
module (``docs/operations.md``, "Processes"):

    celery -A workers.interactive worker      # the interactive lane's pool
    celery -A workers.batch worker            # the batch lane's pool
    celery -A workers.changes worker          # the change consumer's node
    celery -A workers.interactive inspect active
    celery -A workers.interactive flower

Each module is a thin entry over ``dataservice`` (``dataservice/worker/entry.py``):
the same worker, defaults and checks at start as ``dataservice worker --lane
LANE`` and ``dataservice changes``, with settings from the environment. Like
a Procfile, this package belongs to the deployment, not to the ``dataservice``
wheel: run ``celery`` from the directory that holds it.
"""

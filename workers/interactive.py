"""The interactive lane's worker: ``celery -A workers.interactive worker``.

Without options: the threads pool, ``lanes.interactive.concurrency`` threads,
the ``interactive`` queue alone, prefetch 1, late acknowledgement.
"""

from dataservice.enums import LaneName
from dataservice.worker.entry import lane_worker_app

app = lane_worker_app(LaneName.INTERACTIVE)

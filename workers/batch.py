"""The batch lane's worker: ``celery -A workers.batch worker``.

Without options: the threads pool, ``lanes.batch.concurrency`` threads, the
``batch`` queue alone, prefetch 1, late acknowledgement.
"""

from dataservice.enums import LaneName
from dataservice.worker.entry import lane_worker_app

app = lane_worker_app(LaneName.BATCH)

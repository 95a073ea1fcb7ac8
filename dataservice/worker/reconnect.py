"""How a worker's consumer finds its broker again after losing it.

Celery's consumer reconnects with kombu's default pacing: 2 s before the
second attempt, then 4, 6 ... up to 30 s. A broker restarted in two seconds
could leave every worker idle for six more, each one waiting out a step of
a ladder that only protects a broker still struggling. Here the attempts
come every ``STEP_S`` up to ``MAX_S`` apart: one small connection per
worker and attempt, which a Redis that is coming back takes easily.
"""

from __future__ import annotations

from celery import Celery

from dataservice.compat.celery import PacedConsumer

START_S = 0.1
STEP_S = 0.2
MAX_S = 1.0


class PromptConsumer(PacedConsumer):
    reconnect_intervals = (START_S, STEP_S, MAX_S)


def reconnect_promptly(app: Celery) -> None:
    """Have ``app``'s workers use :class:`PromptConsumer`."""
    app.conf.worker_consumer = f"{__name__}:PromptConsumer"

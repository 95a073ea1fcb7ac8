"""Every Redis key and queue name the service uses is built here.

=====================================  ===========================================
key                                    what it holds
=====================================  ===========================================
``<lane queue>``                       Celery's list for a lane (``interactive``, ``batch``)
``ds:result:<request id>``             a list holding one encoded ``ResponseEnvelope``;
                                       expires at the request deadline plus a grace
``ds:admission:<lane queue>``          a hash: envelope bytes queued or in flight,
                                       completions and the measured drain rate
                                       (``dataservice/admission/admit.lua``)
=====================================  ===========================================
"""

from __future__ import annotations

RESULT_PREFIX = "ds:result:"


def result_key(request_id: str) -> str:
    """Where the answer to ``request_id`` waits for its caller."""
    return RESULT_PREFIX + request_id


ADMISSION_PREFIX = "ds:admission:"


def admission_key(queue: str) -> str:
    """A lane's admission counters (bytes queued or in flight, completions, drain rate)."""
    return ADMISSION_PREFIX + queue

r"""Every Redis key and queue name the service uses is built here.

=====================================  ===========================================
key                                    what it holds
=====================================  ===========================================
``<lane queue>``                       Celery's list for a lane (``interactive``, ``batch``)
``<lane queue>\x06\x16<n>``            kombu's priority sub-queues of a lane
``_kombu.binding.<lane queue>``        kombu's routing table for the lane's exchange (and
``_kombu.binding_permanent.<queue>``   its permanent twin)
``ds:admission:<lane queue>``          a hash: envelope bytes queued or in flight,
                                       completions and the measured drain rate
                                       (``dataservice/limits/admit.lua``)
``ds:result:<caller>:<request id>``    a list holding one encoded ``ResponseEnvelope``;
                                       expires at the request deadline plus a grace
``ds:replay:<caller>:<request id>``    a request id already seen; expires with the
                                       request's deadline plus the clock skew
``ds:rate:<caller>``                   the caller's rate state (``dataservice/limits/gate.lua``)
``ds:inflight:<caller>``               a sorted set of the caller's interactive requests
                                       being served, scored by when each slot lapses
``ds:pace:<caller>``                   the caller's publish pacing (``admit.lua``): its
                                       own key, advisory; the gate's ``ds:rate:`` rules
=====================================  ===========================================

Who may touch what is decided by key pattern (:mod:`dataservice.acl`): a
caller's Redis user reaches the lane queues, their routing tables and
admission hashes, and its *own* result and pacing keys; everything else, including
every key added later for the cache and its locks, only the workers' user.
``docs/operations.md`` names these keys too, and a test keeps the two in step.
"""

from __future__ import annotations

RESULT_PREFIX = "ds:result:"
ADMISSION_PREFIX = "ds:admission:"
REPLAY_PREFIX = "ds:replay:"
RATE_PREFIX = "ds:rate:"
INFLIGHT_PREFIX = "ds:inflight:"
PACE_PREFIX = "ds:pace:"
KOMBU_BINDING_PREFIX = "_kombu.binding."
KOMBU_PERMANENT_BINDING_PREFIX = "_kombu.binding_permanent."
# kombu.transport.redis.Channel.sep: between a queue's name and its priority.
KOMBU_PRIORITY_SEP = "\x06\x16"
# The workers' own state about callers and requests: only the workers' Redis
# user reaches these, and only for a request that passed authentication and
# the allowlist. (The cache and its locks join them when they exist.)
WORKER_STATE_PREFIXES = (REPLAY_PREFIX, RATE_PREFIX, INFLIGHT_PREFIX)


def result_key(caller: str, request_id: str) -> str:
    """Where the answer to ``request_id`` waits for its caller."""
    return f"{RESULT_PREFIX}{caller}:{request_id}"


def result_pattern(caller: str) -> str:
    """Every result key of one caller, as a Redis glob (callers' names hold no glob characters)."""
    return f"{RESULT_PREFIX}{caller}:*"


def admission_key(queue: str) -> str:
    """A lane's admission counters (bytes queued or in flight, completions, drain rate)."""
    return ADMISSION_PREFIX + queue


def replay_key(caller: str, request_id: str) -> str:
    return f"{REPLAY_PREFIX}{caller}:{request_id}"


def rate_key(caller: str) -> str:
    return RATE_PREFIX + caller


def inflight_key(caller: str) -> str:
    return INFLIGHT_PREFIX + caller


def binding_key(queue: str) -> str:
    """kombu's routing table for a lane's (direct, same-named) exchange."""
    return KOMBU_BINDING_PREFIX + queue


def permanent_binding_key(queue: str) -> str:
    return KOMBU_PERMANENT_BINDING_PREFIX + queue


def priority_queue_pattern(queue: str) -> str:
    """kombu's priority sub-queues of a lane, as a Redis glob."""
    return f"{queue}{KOMBU_PRIORITY_SEP}*"


def pace_key(caller: str) -> str:
    return PACE_PREFIX + caller

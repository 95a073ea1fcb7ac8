r"""Every Redis key and queue name the service uses is built here.

=====================================  ===========================================
key                                    what it holds
=====================================  ===========================================
``<lane queue>``                       Celery's list for a lane (``interactive``, ``batch``)
``<lane queue>\x06\x16<n>``            kombu's priority sub-queues of a lane
``_kombu.binding.<lane queue>``        kombu's routing table for the lane's exchange (and
``_kombu.binding_permanent.<queue>``   its permanent twin)
``ds:admission:<lane queue>``          a hash: envelope bytes queued or in flight,
                                       completions, the held requests' count, the
                                       measured drain rate, the workers' service time
                                       per operation, refusals by reason and a copy
                                       of ``ds:epoch`` (``dataservice/limits/admit.lua``)
``ds:admission:<lane queue>:held``     a sorted set: the lane's admitted requests not yet
                                       done (``<request id>:<bytes>``), each scored by its
                                       deadline plus a grace, past which it no longer counts
``ds:result:<caller>:<request id>``    a list holding one encoded ``ResponseEnvelope``;
                                       expires at the request deadline plus a grace
``ds:reply:<caller>:<channel>``        a list of encoded ``ResponseEnvelope``\ s: the answers
                                       to the caller's requests that named this reply
                                       channel; expires with the latest one's deadline
                                       plus a grace
``ds:replay:<caller>:<request id>``    a request id already seen; expires with the
                                       request's deadline plus the clock skew
``ds:rate:<caller>``                   the caller's rate state (``dataservice/limits/gate.lua``)
``ds:inflight:<caller>``               a sorted set of the caller's interactive requests
                                       being served, scored by when each slot lapses
``ds:pace:<caller>``                   the caller's publish pacing (``admit.lua``): its
                                       own key, advisory; the gate's ``ds:rate:`` rules
``ds:epoch``                           the broker's epoch: a random token set by the first
                                       request admitted; a Redis that restarted empty
                                       gets a new one (a caller waiting on a request
                                       admitted before is told it may be lost)
``ds:epoch:server``                    on a Sentinel-managed broker, the address of the
                                       primary the epoch belongs to: a process that finds
                                       another primary ends the epoch
                                       (``dataservice/broker/epoch.lua``)
``ds:conf``                            what the publish interface reads of the workers'
                                       ``queues.yml``: each lane's queue and bounds
                                       (``dataservice/broker/library.py``)
``ds:conf:pacing``                     each caller's rate, for the publish's pacing
``record:v1:<scope>:<id>#<gen>``       a cached record, JSON (``docs/cache.md``), in the
                                       namespace generation ``<gen>``
``record:v2:<scope>:<id>#<gen>``       the same record, protobuf
``record:tomb:<scope>:<id>``           the revision a change left: no older fill lands
``ds:lock:<scope>:<id>``               the coalescing lock: the leader's fencing token,
                                       with the leader's lease as its expiry
``ds:lockwait:<scope>:<id>``           how many replicas wait for that leader
``ds:filled:<scope>:<id>``             the leader's word to them: a list, one item each
``ds:shared:<scope>:<id>``             a leader's record (or ``absent``) while the cache is
                                       not read, with when its read ended: requests sent
                                       before then take it (``docs/cache.md``)
``ds:cache:fence``                     the fencing-token counter
``ds:cache:rollout``                   a hash: the rollout controls (``dataservice cache``)
``ds:cache:audit``                     a stream: every change to the controls, who and
                                       what before and after
``ds:cache:shadow``                    a hash: shadow comparisons by what a cached record
                                       was compared with and the outcome
                                       (``database:match``, ...), summed over the replicas
                                       since the control last changed
``changes``                            the change consumer's own queue: nothing is sent
                                       to it; it makes the consumer a worker node
``ds:changes:lease``                   the active change consumer's fencing token,
                                       with its lease as the expiry
``ds:changes:fence``                   the change consumers' fencing-token counter
``ds:changes:status``                  a hash: the active consumer's position, lag
                                       (seconds, events and bytes behind) and when it
                                       last said so (``docs/changes.md``)
``ds:changes:lost``                    in the first cell, a set: the other cells the change
                                       consumer lost while it saved positions past them;
                                       each is rotated before it is called fresh again
``ds:changes:fresh``                   the consumer's word that the cache is fresh within
                                       ``changes.max_lag_s``: it expires when that may
                                       no longer hold (the freshness guard reads it)
=====================================  ===========================================

Who may touch what is decided by key pattern (:mod:`dataservice.security.acl`): a
caller's Redis user reaches the lane queues, their routing tables and
admission hashes, and its *own* result and pacing keys; everything else, the
cache and its locks included, only the workers' user.
``docs/operations.md`` names these keys too, and a test keeps the two in step.
kombu's parts of these names (its binding prefixes, the separator of a
priority) come from :mod:`dataservice.compat.kombu`, which owns kombu's layout.
"""

from __future__ import annotations

from collections.abc import Iterable

from dataservice.compat.kombu import BINDING_PREFIX, PERMANENT_BINDING_PREFIX, PRIORITY_SEP
from dataservice.enums import CacheFormat

RESULT_PREFIX = "ds:result:"
REPLY_PREFIX = "ds:reply:"
ADMISSION_PREFIX = "ds:admission:"
HELD_SUFFIX = ":held"
REPLAY_PREFIX = "ds:replay:"
RATE_PREFIX = "ds:rate:"
INFLIGHT_PREFIX = "ds:inflight:"
PACE_PREFIX = "ds:pace:"
EPOCH_KEY = "ds:epoch"
# What the publish interface (broker/publish.lua) reads of the workers'
# configuration: the lanes' queues and bounds, and the callers' rates.
CONF_KEY = "ds:conf"
PACING_CONF_KEY = "ds:conf:pacing"
EPOCH_SERVER_KEY = "ds:epoch:server"
RECORD_PREFIX = "record:"
LOCK_PREFIX = "ds:lock:"
LOCKWAIT_PREFIX = "ds:lockwait:"
FILLED_PREFIX = "ds:filled:"
SHARED_PREFIX = "ds:shared:"
CACHE_PREFIX = "ds:cache:"
FENCE_KEY = CACHE_PREFIX + "fence"
ROLLOUT_KEY = CACHE_PREFIX + "rollout"
AUDIT_KEY = CACHE_PREFIX + "audit"
SHADOW_KEY = CACHE_PREFIX + "shadow"
CHANGES_QUEUE = "changes"
CHANGES_PREFIX = "ds:changes:"
CHANGES_LEASE_KEY = CHANGES_PREFIX + "lease"
CHANGES_FENCE_KEY = CHANGES_PREFIX + "fence"
CHANGES_STATUS_KEY = CHANGES_PREFIX + "status"
CHANGES_FRESH_KEY = CHANGES_PREFIX + "fresh"
CHANGES_LOST_KEY = CHANGES_PREFIX + "lost"
# Between a cached record's key and its namespace generation: neither a scope
# nor an object id may hold it (dataservice.identifiers).
GENERATION_SEP = "#"
# The workers' own state about callers, requests and records: only the
# workers' Redis user reaches these, and only for a request that passed
# authentication and the allowlist.
WORKER_STATE_PREFIXES = (
    REPLAY_PREFIX,
    RATE_PREFIX,
    INFLIGHT_PREFIX,
    RECORD_PREFIX,
    LOCK_PREFIX,
    LOCKWAIT_PREFIX,
    FILLED_PREFIX,
    SHARED_PREFIX,
    CACHE_PREFIX,
    CHANGES_PREFIX,
)


def result_key(caller: str, request_id: str) -> str:
    """Where the answer to ``request_id`` waits for its caller."""
    return f"{RESULT_PREFIX}{caller}:{request_id}"


def result_pattern(caller: str) -> str:
    """Every result key of one caller, as a Redis glob (callers' names hold no glob characters)."""
    return f"{RESULT_PREFIX}{caller}:*"


def reply_key(caller: str, channel: str) -> str:
    """A reply channel of ``caller``'s: the answers to every request naming it."""
    return f"{REPLY_PREFIX}{caller}:{channel}"


def reply_pattern(caller: str) -> str:
    """Every reply channel of one caller, as a Redis glob."""
    return f"{REPLY_PREFIX}{caller}:*"


def admission_key(queue: str) -> str:
    """A lane's admission counters (bytes queued or in flight, completions, drain rate)."""
    return ADMISSION_PREFIX + queue


def held_key(queue: str) -> str:
    """A lane's admitted requests not yet done, each until its deadline and a grace."""
    return f"{ADMISSION_PREFIX}{queue}{HELD_SUFFIX}"


def replay_key(caller: str, request_id: str) -> str:
    return f"{REPLAY_PREFIX}{caller}:{request_id}"


def rate_key(caller: str) -> str:
    return RATE_PREFIX + caller


def inflight_key(caller: str) -> str:
    return INFLIGHT_PREFIX + caller


def binding_key(queue: str) -> str:
    """kombu's routing table for a lane's (direct, same-named) exchange."""
    return BINDING_PREFIX + queue


def permanent_binding_key(queue: str) -> str:
    return PERMANENT_BINDING_PREFIX + queue


def priority_queue_pattern(queue: str) -> str:
    """kombu's priority sub-queues of a lane, as a Redis glob."""
    return f"{queue}{PRIORITY_SEP}*"


def pace_key(caller: str) -> str:
    return PACE_PREFIX + caller


def record_key(fmt: str, scope: str, object_id: str, generation: int) -> str:
    """A cached record in one format (``v1``, ``v2``) and namespace generation."""
    return f"{RECORD_PREFIX}{fmt}:{scope}:{object_id}{GENERATION_SEP}{generation}"


def tombstone_key(scope: str, object_id: str) -> str:
    """The revision a change left, in every generation at once."""
    return f"{RECORD_PREFIX}tomb:{scope}:{object_id}"


def lock_key(scope: str, object_id: str) -> str:
    return f"{LOCK_PREFIX}{scope}:{object_id}"


def lockwait_key(scope: str, object_id: str) -> str:
    return f"{LOCKWAIT_PREFIX}{scope}:{object_id}"


def filled_key(scope: str, object_id: str) -> str:
    return f"{FILLED_PREFIX}{scope}:{object_id}"


def shared_key(scope: str, object_id: str) -> str:
    return f"{SHARED_PREFIX}{scope}:{object_id}"


# Iterating the enum itself costs a microsecond a time; a big transaction's
# invalidation asks for every record's formats.
_FORMATS = tuple(fmt.value for fmt in CacheFormat)


def change_keys(scope: str, object_id: str, generations: Iterable[int]) -> list[str]:
    """What a committed change to one record touches, in the order
    ``cache/forget.lua`` takes them: its tombstone, its leader's word, then its
    entries in every format and each of ``generations``."""
    return [
        tombstone_key(scope, object_id),
        filled_key(scope, object_id),
        *(
            record_key(fmt, scope, object_id, generation)
            for generation in generations
            for fmt in _FORMATS
        ),
    ]

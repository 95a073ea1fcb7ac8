"""What passes between the request path's steps (:mod:`.handler`)."""

from __future__ import annotations

from dataclasses import dataclass

from dataservice.enums import StatusCode
from dataservice.limits.gate import NOT_LOOKED, Peeked
from dataservice.limits.slots import Slot
from dataservice.observe.trace import Trace
from dataservice.proto import pb
from dataservice.security.auth import Authorised


@dataclass(frozen=True, slots=True)
class Opened:
    """A verified envelope, in time, not yet authorised."""

    task_id: str
    envelope: pb.RequestEnvelope
    now_ms: int
    # Absolute: time spent serving the request does not extend the answer's life.
    expires_at_ms: int
    # Its time so far, for the thread that goes on with it.
    trace: Trace | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request past its caller's limits, holding its in-flight slot: what
    the consumer thread hands the pool when the cache cannot answer."""

    task_id: str
    request: Authorised
    slot: Slot
    expires_at_ms: int
    # The cache entry the gate read on the way in, if it was asked to.
    peeked: Peeked = NOT_LOOKED
    trace: Trace | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """An encoded ``ResponseEnvelope``, for whom, and until when (Unix ms) it is
    of use. ``caller`` is empty when the message named nobody to answer."""

    caller: str
    body: bytes
    expires_at_ms: int
    code: StatusCode
    # The caller's in-flight slot, held until the answer is stored: give it
    # back with the answer (ResultStore) or with RequestHandler.release.
    slot: Slot | None = None
    # Why it was refused (a Reason's value), for the request's log line.
    reason: str = ""
    # The reply channel the signed request named ('' for none, or when the
    # request was not verified): the answer goes there (ResultStore.put).
    channel: str = ""

"""What the caller limits hand out and refuse with, whichever backend decides."""

from __future__ import annotations

from dataclasses import dataclass

from dataservice.config.model import CallerPolicy
from dataservice.refusals import LIMIT_MESSAGES, Reason, Rejected

# Slots are few and short; a freed one is usually this far away.
RETRY_AT_CAP_MS = 25


@dataclass(frozen=True, slots=True)
class Entry:
    """One request at its caller's limits. ``capped``: it counts against the
    caller's in-flight cap (interactive requests do)."""

    policy: CallerPolicy
    caller: str
    request_id: str
    deadline_ms: int
    now_ms: int
    capped: bool
    # The broker delivered it again (its first worker died before acknowledging).
    redelivered: bool = False
    # The operations it carries, each charged to the caller's rate (a batch's many).
    cost: int = 1


@dataclass(frozen=True, slots=True)
class Slot:
    """What a request holds while it runs: its place under the in-flight cap,
    in this replica's fallback count (``local``) and/or in Redis (``in_redis``:
    also after a failed call, which may have taken it before the reply was lost)."""

    caller: str
    request_id: str
    capped: bool
    local: bool
    in_redis: bool


def rejection(reason: Reason, caller: str, retry_after_ms: int = 0) -> Rejected:
    return Rejected(reason, LIMIT_MESSAGES[reason], caller=caller, retry_after_ms=retry_after_ms)

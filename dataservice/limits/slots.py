"""What the caller limits hand out and refuse with, whichever backend decides."""

from __future__ import annotations

from dataclasses import dataclass

from dataservice.refusals import Reason, Rejected

# Slots are few and short; a freed one is usually this far away.
RETRY_AT_CAP_MS = 25

_MESSAGES = {
    Reason.REPLAYED: "request id already used",
    Reason.RATE_LIMITED: "the caller is over its rate",
    Reason.CONCURRENCY_LIMITED: "the caller has too many interactive requests in flight",
    Reason.LIMITS_UNAVAILABLE: "the service cannot check for replays right now",
}


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
    return Rejected(reason, _MESSAGES[reason], caller=caller, retry_after_ms=retry_after_ms)

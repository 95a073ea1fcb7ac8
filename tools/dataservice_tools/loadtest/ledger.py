"""Acknowledged writes against what the database holds after a run.

Each write the harness makes is one call with a key of its own (the client
keeps it across the call's attempts), and every write the service applies
moves its record's revision on by one. So, per record, between the revision
before the load and the one after it:

- **none lost**: the revision after is at least every revision a write of it
  was acknowledged with;
- **none applied twice**: the revisions it moved on by are no more than the
  write calls made to it (answered or not: a call that timed out may have been
  applied), and no two acknowledged writes claim the same revision.

Only the service's own writes may touch the run's records (the harness's
direct SQL, in the ``cached`` scenario, would be counted as extra writes):
the check is made on fault runs, where nothing else writes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import create_engine, text

from dataservice_tools.loadtest.openloop import Outcome, RequestRecord


def revisions(url: str, scope: str) -> dict[str, int]:
    """Every record of ``scope``: its revision now."""
    engine = create_engine(url, pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT object_id, revision FROM records WHERE scope = :s"), {"s": scope}
            ).all()
    finally:
        engine.dispose()
    return {str(object_id): int(revision) for object_id, revision in rows}


def check(
    records: Sequence[RequestRecord], before: dict[str, int], after: dict[str, int]
) -> dict[str, Any]:
    """The ledger's figures and its verdict (``acknowledged_writes_kept_once``)."""
    calls: Counter[str] = Counter()
    acked: defaultdict[str, list[int]] = defaultdict(list)
    for r in records:
        if r.op != "write":
            continue
        calls[r.object_id] += 1
        if r.outcome is Outcome.OK and r.revision:
            acked[r.object_id].append(r.revision)
    lost = sorted(
        object_id for object_id, revs in acked.items() if after.get(object_id, 0) < max(revs)
    )
    twice = sorted(
        object_id
        for object_id, n in calls.items()
        if after.get(object_id, 0) - before.get(object_id, 0) > n
    )
    claimed_twice = sorted(
        object_id for object_id, revs in acked.items() if len(set(revs)) < len(revs)
    )
    applied = sum(max(0, after.get(k, 0) - before.get(k, 0)) for k in after)
    return {
        "write_calls": sum(calls.values()),
        "acknowledged": sum(len(v) for v in acked.values()),
        "applied": applied,
        "acknowledged_lost": lost[:20],
        "applied_more_than_called": twice[:20],
        "revision_acknowledged_twice": claimed_twice[:20],
        "verdict": not (lost or twice or claimed_twice),
    }

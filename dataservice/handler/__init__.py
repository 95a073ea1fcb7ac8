"""The worker's request path, as stages.

- :mod:`.handler`: the order of the contract (open, drop if late, authorise,
  gate, operation, answer): ``RequestHandler.handle(task_id, body, deadline) -> Reply | None``.
- :mod:`.operations`: one object per operation: ``Operation.run(request) -> ResponseEnvelope``;
  reads go through a ``RecordSource`` (the cache's seam).
- :mod:`.readmany`: many reads in one message, each authorised and answered
  on its own, looked up together.
- :mod:`.batch`: a batch message's operations, each checked and answered
  apart, applied a transaction per permit: ``Batch.run(envelope) -> [(op, answer)]``.
- :mod:`.database`: the time budget and the permit: ``Database.run(op_class, deadline, fn)``.
- :mod:`.failures`: every internal failure to a status code and retry-after:
  ``verdict(refusal) -> Verdict``.
- :mod:`.durations`: how long each operation class recently took.
"""

from __future__ import annotations

from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.handler.batch import Batch
from dataservice.handler.database import Database
from dataservice.handler.handler import RequestHandler
from dataservice.handler.operations import DatabaseSource, operations
from dataservice.handler.source import RecordSource
from dataservice.handler.steps import Reply
from dataservice.limits.gate import Gate
from dataservice.security.auth import Authenticator
from dataservice.store import RecordStore

__all__ = ["Database", "RecordSource", "Reply", "RequestHandler", "build_handler"]


def build_handler(
    config: Config,
    lane: LaneName,
    store: RecordStore,
    database: Database,
    authenticator: Authenticator,
    gate: Gate,
    source: RecordSource | None = None,
) -> RequestHandler:
    """A lane's request path, stage by stage, its operations reaching the
    database through ``database`` (its permits and time budget), its reads
    through ``source`` (the cache) when there is one."""
    lane_config = config.lanes[lane]
    source = source or DatabaseSource(database, store, lane_config.max_ops_per_transaction)
    ops = operations(database, store, config.limits, source)
    batch = Batch(database, store, config.limits, lane_config, source)
    return RequestHandler(config, lane, authenticator, gate, ops, batch)

"""The database budget arithmetic, computed in one place.

The database sustains ``budget.database_active`` concurrently active short
transactions; ``budget.reserved`` of them belong to maintenance and other
callers. The service's replicas (``budget.max_replicas``, rolling-deploy
overlap included, in each cell: :mod:`dataservice.config.cells`) share the
rest. A replica is one worker process per lane;
each process holds at most its lane's permits, plus one administrative
statement (:data:`ADMIN_STATEMENTS`): the process's own connection that
confirms the server has let go of a statement the process gave up on
(:mod:`dataservice.store.custody`). Connections are a separate bound: each
process's pool holds one connection per worker thread, never more than the
lane's permits (a thread takes one only while it holds a permit; threads
beyond the permits get the next request ready meanwhile), plus the
administrative one, and all replicas together stay within
``budget.max_connections``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dataservice.config.model import Config, LaneConfig
from dataservice.enums import LaneName, OperationClass
from dataservice.errors import ConfigError

# Each worker process's administrative connection, and the one statement it
# runs at a time (a KILL, or a look at the process list).
ADMIN_CONNECTIONS = 1
ADMIN_STATEMENTS = 1


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """The arithmetic, line by line, and every bound it breaks."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class ProcessShare:
    """What one worker process of a lane may hold in the database."""

    permits: int
    pool: int

    @property
    def active(self) -> int:
        """Statements at once: its permits and its administrative statement."""
        return self.permits + ADMIN_STATEMENTS

    @property
    def connections(self) -> int:
        """Its pool and its administrative connection."""
        return self.pool + ADMIN_CONNECTIONS


def process_share(lane: LaneConfig, threads: int | None = None) -> ProcessShare:
    """The share of one worker process of ``lane`` running ``threads`` threads
    (default: the lane's concurrency)."""
    threads = lane.concurrency if threads is None else threads
    return ProcessShare(lane.permits, pool_size(threads, lane.permits))


def _verdict(used: int, bound: int) -> str:
    return f"<= {bound} ok" if used <= bound else f"> {bound} OVER by {used - bound}"


def check_budget(config: Config) -> BudgetCheck:
    budget = config.budget
    check = BudgetCheck()
    lines, problems = check.lines, check.problems

    available = budget.database_active - budget.reserved
    lines.append(
        f"database: {budget.database_active} active - {budget.reserved} reserved = "
        f"{available} for the service"
    )
    if available <= 0:
        problems.append(
            f"budget.reserved ({budget.reserved}) leaves nothing of "
            f"budget.database_active ({budget.database_active})"
        )

    lanes = [(name, config.lanes[name], process_share(config.lanes[name])) for name in LaneName]
    per_replica = sum(share.active for _, _, share in lanes)
    split = " + ".join(
        f"{name.value} {share.permits} + {ADMIN_STATEMENTS}" for name, _, share in lanes
    )
    lines.append(
        f"statements per replica: {split} = {per_replica} "
        f"(each lane's permits + its process's administrative statement)"
    )
    replicas, of = _replicas(config)
    total = replicas * per_replica
    lines.append(
        f"all replicas: {of}{per_replica} statements = {total} {_verdict(total, available)}"
    )
    if total > available:
        problems.append(
            f"{of}{per_replica} statements = {total} exceeds "
            f"{budget.database_active} - {budget.reserved} = {available}: lower "
            "budget.max_replicas, the cells or the lanes' permits"
        )

    for name, lane, share in lanes:
        classes = ", ".join(f"{c.value} {lane.classes[c]}" for c in OperationClass)
        lines.append(
            f"{name.value}: {lane.concurrency} threads, {lane.permits} permits, "
            f"{share.pool} + {ADMIN_CONNECTIONS} connections; "
            f"classes {classes} (each <= {lane.permits})"
        )
        for op_class in OperationClass:
            if lane.classes[op_class] > lane.permits:
                problems.append(
                    f"lanes.{name.value}.classes.{op_class.value} ({lane.classes[op_class]}) "
                    f"exceeds lanes.{name.value}.permits ({lane.permits})"
                )

    per_replica_conns = sum(share.connections for _, _, share in lanes)
    conns = replicas * per_replica_conns
    pools = " + ".join(
        f"{name.value} {share.pool} + {ADMIN_CONNECTIONS}" for name, _, share in lanes
    )
    lines.append(
        f"connections: {pools} = {per_replica_conns} per replica x {replicas} "
        f"replicas = {conns} {_verdict(conns, budget.max_connections)}"
    )
    if conns > budget.max_connections:
        problems.append(
            f"{of}{per_replica_conns} connections = {conns} exceeds "
            f"budget.max_connections ({budget.max_connections})"
        )
    return check


def _replicas(config: Config) -> tuple[int, str]:
    """Replicas of the whole deployment, and how they are counted: every
    cell runs up to ``budget.max_replicas`` of its own."""
    per_cell = config.budget.max_replicas
    cells = config.cells.count
    if not config.cells.names:
        return per_cell, f"{per_cell} replicas x "
    return cells * per_cell, f"{cells} cells x {per_cell} replicas x "


def pool_size(concurrency: int, permits: int) -> int:
    """A process's pooled database connections: one per thread, but never
    more than its permits (a thread takes a connection only while it holds a
    permit; threads beyond the permits get a request ready meanwhile)."""
    return min(concurrency, permits)


def require_within_budget(config: Config, lane: LaneName, concurrency: int) -> None:
    """Refuse a worker whose configuration breaks the budget. Its thread count
    cannot: its connections are at most its lane's permits."""
    check = check_budget(config)
    if not check.ok:
        raise ConfigError(
            "the configuration exceeds the database budget: " + "; ".join(check.problems)
        )
    if concurrency < 1:
        raise ConfigError(f"--concurrency {concurrency}: a worker needs at least one thread")

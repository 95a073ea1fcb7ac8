"""What the incident scenarios need besides load: the callers' timeouts, the
database slowed down under running workers, and the capacity at both speeds.

``downsized-db`` multiplies every operation's injected time in the database
mid-run (:mod:`.delay`). The capacity that applies afterwards is measured, not
assumed: the closed-loop probe runs at the slower speed first, then at the
starting speed (so the workers' recent statement times, which decide what they
refuse for lack of time, are the starting speed's when the run begins).
"""

from __future__ import annotations

from collections.abc import Callable

from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.errors import ConfigError
from dataservice_tools.loadtest.delay import DelayTable
from dataservice_tools.loadtest.scenarios import Scenario

# The batch lane's callers wait this long (its lane default of 300 s does not fit a short run).
BATCH_TIMEOUT_S = 5.0

Capacity = dict[LaneName, float]


def lane_timeouts(config: Config, scenario: Scenario) -> dict[LaneName, float]:
    """How long callers wait on each lane, in seconds."""
    lane = config.lanes.interactive
    # The service's own permit wait, where it is a bound ("deadline": none).
    permit_wait_ms = lane.permit_wait_ms if isinstance(lane.permit_wait_ms, int) else None
    interactive_ms = (
        permit_wait_ms
        if scenario.timeout_is_pool_wait and permit_wait_ms is not None
        else lane.default_deadline_ms
    )
    return {LaneName.INTERACTIVE: interactive_ms / 1000, LaneName.BATCH: BATCH_TIMEOUT_S}


class SlowDown:
    """The run's database speed: ``before_ms`` of injected time per operation,
    then ``after_ms`` from the event on."""

    def __init__(self, scenario: Scenario, delay_ms: int, root_url: str, database: str) -> None:
        if delay_ms <= 0:
            raise ConfigError(
                f"scenario {scenario.name} multiplies the time each operation spends in the "
                "database, and there is none to multiply: give one with --db-delay-ms"
            )
        self.before_ms = delay_ms
        self.after_ms = round(delay_ms * scenario.slow_down_factor)
        self._table = DelayTable(root_url, database)

    @classmethod
    def of(cls, scenario: Scenario, delay_ms: int, root_url: str, database: str) -> SlowDown | None:
        if scenario.slow_down_at is None:
            return None
        return cls(scenario, delay_ms, root_url, database)

    @property
    def table(self) -> str:
        """The delay table the run's configuration names (database.injected_delay_table)."""
        return self._table.table

    def create(self) -> None:
        self._table.create(self.before_ms)

    def slow(self) -> None:
        self._table.set(self.after_ms)

    def restore(self) -> None:
        self._table.set(self.before_ms)

    def probe_slow(self, probe: Callable[[], Capacity]) -> Capacity:
        """``probe``'s capacity with the database at the slower speed; the
        starting speed is back afterwards, whatever happened."""
        self.slow()
        try:
            return probe()
        finally:
            self.restore()

    def describe(self) -> dict[str, int]:
        return {"delay_ms_before": self.before_ms, "delay_ms_after": self.after_ms}

    def close(self) -> None:
        self._table.close()

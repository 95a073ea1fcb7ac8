"""Typed, frozen configuration: the ``queues.yml`` schema.

Loading validates everything at once; an unknown key or a bad value raises
:class:`~dataservice.errors.ConfigError` naming the key. Numbers derived from
the configuration are computed here and nowhere else. Where the services are
(``DATASERVICE_*``) is :mod:`dataservice.config.settings`; the names shared by every
part of the service are :mod:`dataservice.enums`.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidationError, model_validator

from dataservice import identifiers
from dataservice.config.cache import CacheConfig
from dataservice.config.cells import CellsConfig
from dataservice.config.frozen import FrozenModel
from dataservice.config.rate import Rate
from dataservice.enums import LaneName, OperationClass
from dataservice.errors import ConfigError

PositiveInt = Annotated[int, Field(gt=0)]

# A MEDIUMBLOB column and MariaDB's default max_allowed_packet (16 MiB) bound
# what a payload may be; 1 MiB keeps a single row well inside both.
PAYLOAD_CEILING = 1 << 20
# Field tags, ids and the envelope header fit in this on top of the payload.
ENVELOPE_OVERHEAD = 1024


class ClassPermits(FrozenModel):
    point_read: PositiveInt
    point_write: PositiveInt
    bounded_list: PositiveInt

    def __getitem__(self, op_class: OperationClass) -> int:
        value: int = getattr(self, op_class.value)
        return value


class BudgetConfig(FrozenModel):
    database_active: PositiveInt
    reserved: Annotated[int, Field(ge=0)]
    max_replicas: PositiveInt
    max_connections: PositiveInt


class AdmissionConfig(FrozenModel):
    max_messages: Annotated[int, Field(gt=0, le=10_000_000)]
    max_bytes: Annotated[int, Field(gt=0, le=1 << 34)]
    # A standing queue's target wait (ms): past it, publishes are refused. None: no target.
    target_wait_ms: Annotated[int, Field(gt=0, le=3_600_000)] | None = None


# A lane whose requests wait for a database permit as long as each one's
# deadline allows (less what its operation needs in the database).
UNTIL_DEADLINE: Final = "deadline"
LONGEST_PERMIT_WAIT_MS = 60_000


def _permit_wait(value: object) -> object:
    # One message for either form, rather than one per branch of the union.
    if value == UNTIL_DEADLINE or (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 0 < value <= LONGEST_PERMIT_WAIT_MS
    ):
        return value
    raise ValueError(
        f"expected milliseconds (1 to {LONGEST_PERMIT_WAIT_MS}) or {UNTIL_DEADLINE!r}, "
        f"got {value!r}"
    )


PermitWait = Annotated[int | Literal["deadline"], BeforeValidator(_permit_wait)]


class LaneConfig(FrozenModel):
    queue: str = Field(pattern=identifiers.anchored(identifiers.QUEUE))
    permits: Annotated[int, Field(gt=0, le=256)]
    concurrency: Annotated[int, Field(gt=0, le=256)]
    classes: ClassPermits
    # How long a request waits for a database permit: so many ms, then it is
    # refused (reason no_permit, retryable: fail fast), or UNTIL_DEADLINE,
    # then it is out of time; never refused for want of one.
    permit_wait_ms: PermitWait
    admission: AdmissionConfig
    default_deadline_ms: PositiveInt
    max_deadline_ms: PositiveInt
    # Celery task events (Flower's tasks page): a Redis PUBLISH or more per request.
    task_events: bool = False
    # Batches (docs/operations.md, "Batches"): writes and deletes packed into
    # one signed message, committed a transaction per permit.
    max_ops_per_message: Annotated[int, Field(gt=0, le=1000)] = 1
    # A whole batch message's envelope; None: limits.max_request_bytes.
    max_message_bytes: Annotated[int, Field(gt=0, le=64 << 20)] | None = None
    max_ops_per_transaction: Annotated[int, Field(gt=0, le=1000)] = 100
    # How long one transaction may stay open: its statements' time is cut to it.
    max_transaction_ms: Annotated[int, Field(ge=10, le=60_000)] = 1000

    @model_validator(mode="after")
    def _default_within_max(self) -> LaneConfig:
        if self.default_deadline_ms > self.max_deadline_ms:
            raise ValueError(
                f"default_deadline_ms ({self.default_deadline_ms}) exceeds "
                f"max_deadline_ms ({self.max_deadline_ms})"
            )
        return self

    @model_validator(mode="after")
    def _permit_wait_below_deadline(self) -> LaneConfig:
        # A wait as long as the caller's own leaves no time to run once it ends.
        wait = self.permit_wait_ms
        if isinstance(wait, int) and wait >= self.default_deadline_ms:
            raise ValueError(
                f"permit_wait_ms ({wait}) must be shorter than default_deadline_ms "
                f"({self.default_deadline_ms}), or {UNTIL_DEADLINE!r}"
            )
        return self


class Lanes(FrozenModel):
    interactive: LaneConfig
    batch: LaneConfig

    @model_validator(mode="after")
    def _distinct_queues(self) -> Lanes:
        if self.interactive.queue == self.batch.queue:
            raise ValueError("interactive and batch must use different queues")
        return self

    def __getitem__(self, lane: LaneName) -> LaneConfig:
        return self.interactive if lane is LaneName.INTERACTIVE else self.batch


class Limits(FrozenModel):
    max_payload_bytes: Annotated[int, Field(gt=0, le=PAYLOAD_CEILING)]
    max_request_bytes: PositiveInt
    max_response_bytes: PositiveInt
    list_default_page_size: PositiveInt
    list_max_page_size: Annotated[int, Field(gt=0, le=1000)]

    @model_validator(mode="after")
    def _consistent(self) -> Limits:
        smallest = self.max_payload_bytes + ENVELOPE_OVERHEAD
        if self.max_request_bytes < smallest:
            raise ValueError(
                f"max_request_bytes ({self.max_request_bytes}) must be at least "
                f"max_payload_bytes + {ENVELOPE_OVERHEAD} ({smallest})"
            )
        if self.max_response_bytes < self.max_payload_bytes + ENVELOPE_OVERHEAD:
            raise ValueError("max_response_bytes must fit one record of max_payload_bytes")
        if self.list_default_page_size > self.list_max_page_size:
            raise ValueError("list_default_page_size exceeds list_max_page_size")
        return self


class Results(FrozenModel):
    grace_ms: Annotated[int, Field(ge=0, le=60_000)]


class DatabaseConfig(FrozenModel):
    connect_timeout_s: Annotated[int, Field(gt=0, le=60)]
    pool_timeout_ms: PositiveInt
    pool_recycle_s: PositiveInt
    max_statement_ms: Annotated[int, Field(ge=10, le=600_000)]
    connect_rate_per_s: Annotated[float, Field(gt=0, le=10_000)]
    connect_burst: Annotated[int, Field(gt=0, le=10_000)]
    injected_delay_ms: Annotated[int, Field(ge=0, le=60_000)]
    # Load tests only: a one-row table (column ``delay_ms``) in the service's
    # database that the injected sleep reads in the same statement, so that a
    # run can change the database's speed under running workers.
    injected_delay_table: (
        Annotated[str, Field(pattern=identifiers.anchored(identifiers.TABLE))] | None
    ) = None


OperationName = Literal["read", "write", "delete", "list"]
LaneId = Literal["interactive", "batch"]
CallerName = Annotated[str, Field(pattern=identifiers.anchored(identifiers.CALLER))]


class CallerPolicy(FrozenModel):
    """What one caller may do, and how much. Its keys live elsewhere
    (``DATASERVICE_CALLERS_FILE``), never in ``queues.yml``."""

    scopes: Annotated[
        tuple[Annotated[str, Field(pattern=identifiers.anchored(identifiers.SCOPE_GRANT))], ...],
        Field(strict=False, min_length=1),
    ]
    operations: Annotated[tuple[OperationName, ...], Field(strict=False, min_length=1)]
    lanes: Annotated[tuple[LaneId, ...], Field(strict=False, min_length=1)]
    rate_per_s: Annotated[float, Field(gt=0, le=1_000_000)]
    burst: Annotated[int, Field(gt=0, le=1_000_000)]
    # Interactive requests of this caller being served at once, service-wide.
    max_interactive: Annotated[int, Field(gt=0, le=10_000)]

    @property
    def rate(self) -> Rate:
        """``rate_per_s`` and ``burst`` as the rate algorithm takes them."""
        return Rate.per_second(self.rate_per_s, self.burst)

    def allows_scope(self, scope: str) -> bool:
        return any(fnmatchcase(scope, pattern) for pattern in self.scopes)


class IdempotencyConfig(FrozenModel):
    # How long a mutation's outcome answers retries under its key.
    retention_s: Annotated[int, Field(ge=60, le=30 * 86_400)]
    # Expired outcomes deleted per statement, and how often the batch lane runs one.
    purge_batch: Annotated[int, Field(gt=0, le=10_000)]
    purge_interval_s: Annotated[int, Field(gt=0, le=86_400)]


class AuthConfig(FrozenModel):
    # How far a caller's clock may be from ours, either way.
    max_clock_skew_ms: Annotated[int, Field(ge=0, le=300_000)]


class RetryConfig(FrozenModel):
    # How a client retries a retryable answer, inside the request's one deadline.
    max_attempts: Annotated[int, Field(gt=0, le=20)]
    backoff_base_ms: PositiveInt
    backoff_max_ms: PositiveInt


class ThrottleConfig(FrozenModel):
    # Per client and lane: about k x what the service accepts over window_ms is sent.
    enabled: bool = True
    k: Annotated[float, Field(ge=1.0, le=10.0)] = 2.0
    window_ms: Annotated[int, Field(ge=100, le=60_000)] = 1000


class ClientConfig(FrozenModel):
    retry: RetryConfig
    throttle: ThrottleConfig = ThrottleConfig()


class BrokerConfig(FrozenModel):
    # After this long unacknowledged, a message goes to another worker. 0: the
    # longest lane deadline + 60 s, so that a request never runs twice at once.
    visibility_timeout_s: Annotated[int, Field(ge=0, le=86_400)]
    # How often each worker looks for such messages (kombu's restore sweep).
    restore_every_s: Annotated[int, Field(gt=0, le=3_600)]


class LoggingConfig(FrozenModel):
    # json: one object per line (for log pipelines); text: for reading in a terminal.
    format: Literal["json", "text"] = "json"
    # A line per request answered or dropped: all, failures (anything but OK), none.
    requests: Literal["all", "failures", "none"] = "all"


class ChangesConfig(FrozenModel):
    # The consumer's replication id: unique among the database server's replicas.
    server_id: Annotated[int, Field(gt=0, lt=1 << 32)]
    # An active consumer's lease in Redis; a standby takes over once it lapses.
    lease_ms: Annotated[int, Field(ge=500, le=60_000)]
    # Past this lag (or with no active consumer), ALLOW_CACHED reads go to the database.
    max_lag_s: Annotated[float, Field(gt=0, le=3_600, strict=False)]
    # Whether the cache is read only while a consumer reports within max_lag_s:
    # off only where no change stream runs and nothing changes records but the service.
    guard: bool
    # The longest wait between reconnects to the database (a doubling ramp up to it).
    reconnect_max_s: Annotated[float, Field(gt=0, le=300, strict=False)]


class Config(FrozenModel):
    budget: BudgetConfig
    lanes: Lanes
    limits: Limits
    results: Results
    database: DatabaseConfig
    auth: AuthConfig
    idempotency: IdempotencyConfig
    client: ClientConfig
    broker: BrokerConfig
    cache: CacheConfig
    changes: ChangesConfig
    logging: LoggingConfig = LoggingConfig()
    cells: CellsConfig = CellsConfig()
    callers: dict[CallerName, CallerPolicy]

    @model_validator(mode="after")
    def _pool_wait_below_deadlines(self) -> Config:
        shortest = min(
            self.lanes.interactive.default_deadline_ms, self.lanes.batch.default_deadline_ms
        )
        if self.database.pool_timeout_ms >= shortest:
            raise ValueError(
                f"database.pool_timeout_ms ({self.database.pool_timeout_ms}) must be shorter "
                f"than the shortest default deadline ({shortest} ms)"
            )
        return self

    @model_validator(mode="after")
    def _a_request_fits_each_queue(self) -> Config:
        for name, lane in (("interactive", self.lanes.interactive), ("batch", self.lanes.batch)):
            if lane.admission.max_bytes < self.limits.max_request_bytes:
                raise ValueError(
                    f"lanes.{name}.admission.max_bytes ({lane.admission.max_bytes}) is below "
                    f"limits.max_request_bytes ({self.limits.max_request_bytes})"
                )
        return self

    @model_validator(mode="after")
    def _a_batch_fits_its_lane(self) -> Config:
        for name, lane in (("interactive", self.lanes.interactive), ("batch", self.lanes.batch)):
            size = lane.max_message_bytes
            if size is not None and size < self.limits.max_request_bytes:
                raise ValueError(
                    f"lanes.{name}.max_message_bytes ({size}) is below "
                    f"limits.max_request_bytes ({self.limits.max_request_bytes})"
                )
            if lane.max_ops_per_message > lane.admission.max_messages:
                raise ValueError(
                    f"lanes.{name}.max_ops_per_message ({lane.max_ops_per_message}) exceeds "
                    f"lanes.{name}.admission.max_messages ({lane.admission.max_messages})"
                )
        return self

    def cell_of(self, caller: str) -> str | None:
        """The cell ``caller`` belongs to (None: no cells are named)."""
        return self.cells.cell_of(caller, self.callers)

    def message_bytes(self, lane: LaneConfig) -> int:
        """The most envelope bytes one message on ``lane`` may carry: its
        ``max_message_bytes`` (else one request's), within what its queue may
        hold at once (a larger message could never be admitted)."""
        size = lane.max_message_bytes or self.limits.max_request_bytes
        return min(size, max(lane.admission.max_bytes, self.limits.max_request_bytes))

    @property
    def longest_deadline_ms(self) -> int:
        return max(self.lanes.interactive.max_deadline_ms, self.lanes.batch.max_deadline_ms)


def _describe(error: ValidationError, source: str) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"{source}: {where}: {message}")
    return "\n".join(lines)


def parse_config(data: Any, *, source: str = "queues.yml") -> Config:
    """Validate an already-parsed YAML document."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, source=str(path))

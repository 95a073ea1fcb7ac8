"""The ``cache:`` section of ``queues.yml`` (``docs/cache.md``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict, model_validator

from dataservice.config.frozen import FrozenModel
from dataservice.enums import CacheFormat


class BreakerConfig(FrozenModel):
    """When the cache's Redis stops answering: after ``failures`` errors in a
    row, cache calls stop for ``open_ms``, then one call probes it again."""

    failures: Annotated[int, Field(gt=0, le=1000)]
    open_ms: Annotated[int, Field(gt=0, le=60_000)]


# An enum from its YAML string (the model is otherwise strict).
_Format = Annotated[CacheFormat, Strict(False)]


class RolloutConfig(FrozenModel):
    """The rollout controls' values until an operator changes them (they live
    in Redis: ``dataservice cache``)."""

    fill: Annotated[frozenset[_Format], Field(strict=False)]
    read: _Format | None
    percent: Literal[1, 10, 25, 50, 75, 100]
    # Of ALLOW_CACHED hits, also compared with the database (0: none).
    shadow: Literal[0, 1, 10, 25, 50, 75, 100]

    @model_validator(mode="after")
    def _read_what_is_filled(self) -> RolloutConfig:
        if self.read is not None and self.read not in self.fill:
            raise ValueError(f"cache.rollout.read ({self.read}) is not among the filled formats")
        return self


class ShadowConfig(FrozenModel):
    """What shadow comparisons may cost a replica (``docs/cache.md``)."""

    # Comparisons running at once per lane and replica; a hit sampled beyond it is skipped.
    max_inflight: Annotated[int, Field(gt=0, le=64)]
    # A comparison's database read is stopped after this long.
    timeout_ms: Annotated[int, Field(ge=10, le=5_000)]


class CacheConfig(FrozenModel):
    # How long an entry lives, counted from when its database read began.
    ttl_s: Annotated[int, Field(gt=0, le=86_400)]
    # A coalescing leader's hold on a key; past it, one follower takes over.
    lock_lease_ms: Annotated[int, Field(ge=10, le=30_000)]
    # False: each miss reads the database itself, no lock, no sharing (a bench baseline).
    coalesce: bool
    # Keys with a read in flight in one worker process (beyond it: no coalescing).
    max_inflight_keys: Annotated[int, Field(gt=0, le=1_000_000)]
    # Every cache command's socket timeout: a slow cache must cost less than the database.
    socket_timeout_ms: Annotated[int, Field(gt=0, le=5_000)]
    # How long a replica keeps the rollout controls before reading them again.
    controls_max_age_ms: Annotated[int, Field(gt=0, le=5_000)]
    breaker: BreakerConfig
    rollout: RolloutConfig
    shadow: ShadowConfig

"""The rollout controls' values, and how Redis holds them.

:class:`Rollout` is what a replica acts on; ``rollout.lua``'s header names the
hash's fields and the audit stream's, and :func:`to_hash` and
:func:`from_hash` are their one encoding on this side. The controls
themselves (reading and changing them): :mod:`dataservice.cache.controls`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from dataservice.config.cache import RolloutConfig
from dataservice.enums import CacheFormat
from dataservice.errors import InvalidControl
from dataservice.redis.keys import AUDIT_KEY, ROLLOUT_KEY

# queues.yml's own choices, so the defaults and a change accept the same percentages.
PERCENTS: tuple[int, ...] = get_args(RolloutConfig.model_fields["percent"].annotation)
SHADOW_PERCENTS: tuple[int, ...] = get_args(RolloutConfig.model_fields["shadow"].annotation)
# Picks the compared hits apart from the cached reads' percentage: the CRC-32
# of the request id, started from another value.
_SHADOW_SEED = 0x5AD0
NONE = "none"

Source = Literal["redis", "defaults"]


@dataclass(frozen=True, slots=True)
class Rollout:
    """The controls' values at one moment."""

    fill: frozenset[CacheFormat]  # formats written when a database read fills the cache
    read: CacheFormat | None  # the format ALLOW_CACHED reads look in; None: none
    percent: int  # of ALLOW_CACHED reads that look in the cache (PERCENTS)
    bypass: bool  # reads go to the database: no cache reads, no fills
    shadow: int  # of ALLOW_CACHED hits also compared with the database (SHADOW_PERCENTS)
    generation: int  # the namespace generation (>= 1); rotating it orphans every entry
    rotated_at_ms: int  # Unix ms of the last rotation, 0 if never
    source: Source  # "redis", or "defaults": queues.yml, nothing in Redis yet

    @property
    def read_percent(self) -> int:
        """The share of reads that look in the cache: 0 under bypass or with no read format."""
        return 0 if self.bypass or self.read is None else self.percent

    def read_format(self, request_id: str) -> CacheFormat | None:
        """The format this request reads, or None (bypass, no read format, or
        outside the percentage). The same request id gets the same answer on
        every replica, and one inside a percentage stays inside a larger one."""
        if zlib.crc32(request_id.encode()) % 100 >= self.read_percent:
            return None
        return self.read

    def shadowed(self, request_id: str) -> bool:
        """Whether this request's hit is also compared (``docs/cache.md``,
        "Shadow comparisons"): the same answer on every replica, and not tied
        to whether the request reads the cache at all."""
        return zlib.crc32(request_id.encode(), _SHADOW_SEED) % 100 < self.shadow

    def fill_formats(self) -> frozenset[CacheFormat]:
        """Formats to fill: none under bypass."""
        return frozenset() if self.bypass else self.fill

    @property
    def reads_unfilled(self) -> bool:
        """Reads look (or will, once bypass is off) in a format no fill writes:
        allowed, as a rollout or rollback passes through it, but each such read misses."""
        return self.read is not None and self.read not in self.fill

    def describe(self) -> dict[str, str]:
        """Each control's value as an operator writes it (``fill=v1,v2``)."""
        return {
            "fill": joined(self.fill) or NONE,
            "read": self.read.value if self.read is not None else NONE,
            "percent": str(self.percent),
            "bypass": "on" if self.bypass else "off",
            "shadow": str(self.shadow),
            "generation": str(self.generation),
        }

    def __str__(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.describe().items())


@dataclass(frozen=True, slots=True)
class Change:
    before: Rollout
    after: Rollout


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: str  # the stream entry's id
    at_ms: int  # when, by Redis's clock (Unix ms)
    who: str  # the operator's OS user
    action: str  # "change" or "rotate"
    before: Rollout
    after: Rollout


def parse_formats(text: str) -> frozenset[CacheFormat]:
    """``v1,v2``, ``v1``, ``v2`` or ``none``, as ``dataservice cache fill`` takes them."""
    if text.strip() == NONE:
        return frozenset()
    return frozenset(check_format(part.strip(), "fill") for part in text.split(","))


def parse_format(text: str) -> CacheFormat | None:
    """``v1``, ``v2`` or ``none``, as ``dataservice cache read`` takes them."""
    return None if text.strip() == NONE else check_format(text.strip(), "read")


def check_format(value: str, control: str) -> CacheFormat:
    try:
        return CacheFormat(value)
    except ValueError:
        known = ", ".join(f.value for f in CacheFormat)
        raise InvalidControl(f"{control}: {value!r} is not a cache format ({known})") from None


def check_percent(percent: int) -> int:
    if isinstance(percent, bool) or percent not in PERCENTS:
        known = ", ".join(map(str, PERCENTS))
        raise InvalidControl(f"percent: {percent!r} is not one of {known}")
    return percent


def check_shadow(percent: int) -> int:
    if isinstance(percent, bool) or percent not in SHADOW_PERCENTS:
        known = ", ".join(map(str, SHADOW_PERCENTS))
        raise InvalidControl(f"shadow: {percent!r} is not one of {known}")
    return percent


def joined(formats: frozenset[CacheFormat]) -> str:
    return ",".join(sorted(f.value for f in formats))


def decoded(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decoded_pairs(flat: list[Any]) -> dict[str, str]:
    return {decoded(flat[i]): decoded(flat[i + 1]) for i in range(0, len(flat), 2)}


def to_hash(rollout: Rollout) -> dict[str, str]:
    """A rollout as the hash holds it (``rollout.lua``'s header)."""
    return {
        "fill": joined(rollout.fill),
        "read": rollout.read.value if rollout.read is not None else "",
        "percent": str(rollout.percent),
        "bypass": "1" if rollout.bypass else "0",
        "shadow": str(rollout.shadow),
        "generation": str(rollout.generation),
        "rotated_at_ms": str(rollout.rotated_at_ms),
    }


def from_hash(fields: Mapping[str, str], where: str = ROLLOUT_KEY) -> Rollout:
    """The inverse of :func:`to_hash`, with ``source``; a value no change
    writes raises :class:`InvalidControl` naming ``where`` it was found."""
    try:
        percent = int(fields["percent"])
        generation = int(fields["generation"])
        # Controls (and audit entries) written before the control existed lack it.
        shadow = int(fields.get("shadow", "0"))
        if percent not in PERCENTS or generation < 1 or fields["bypass"] not in ("0", "1"):
            raise ValueError
        if shadow not in SHADOW_PERCENTS:
            raise ValueError
        return Rollout(
            fill=frozenset(check_format(f, "fill") for f in fields["fill"].split(",") if f),
            read=check_format(fields["read"], "read") if fields["read"] else None,
            percent=percent,
            bypass=fields["bypass"] == "1",
            shadow=shadow,
            generation=generation,
            rotated_at_ms=int(fields["rotated_at_ms"]),
            source="redis" if fields["source"] == "redis" else "defaults",
        )
    except (KeyError, ValueError, InvalidControl):
        shown = {k: v for k, v in fields.items() if k != "source"}
        raise InvalidControl(f"{where} holds values no change writes: {shown}") from None


def audit_entry(entry_id: str, raw: Mapping[Any, Any]) -> AuditEntry:
    fields = {decoded(k): decoded(v) for k, v in raw.items()}
    before = {k.removeprefix("before."): v for k, v in fields.items() if k.startswith("before.")}
    after = {k.removeprefix("after."): v for k, v in fields.items() if k.startswith("after.")}
    where = f"{AUDIT_KEY} entry {entry_id}"
    try:
        at_ms, who, action = int(fields["at_ms"]), fields["who"], fields["action"]
    except (KeyError, ValueError):
        raise InvalidControl(f"{where} is not an audit entry") from None
    return AuditEntry(
        id=entry_id,
        at_ms=at_ms,
        who=who,
        action=action,
        before=from_hash(before, where),
        after=from_hash({**after, "source": "redis"}, where),
    )

"""The shadow control and the comparison rule, without workers
(``docs/cache.md``, "Shadow comparisons")."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest
import redis

from dataservice.cache.controls import RolloutControls
from dataservice.cache.rollout import SHADOW_PERCENTS, Rollout, from_hash, to_hash
from dataservice.cache.shadow import MISMATCHES, Outcome, compare, describe_counts
from dataservice.config.model import Config
from dataservice.enums import CacheFormat
from dataservice.errors import InvalidControl
from dataservice.proto import pb
from dataservice.redis.keys import ROLLOUT_KEY, SHADOW_KEY

ROLLOUT = Rollout(frozenset(CacheFormat), CacheFormat.V2, 100, False, 0, 1, 0, "redis")
RECORD = pb.Record(object_id="a", revision=7, payload=b"seven", updated_at_unix_ms=1000)


def _with(**fields: object) -> pb.Record:
    record = pb.Record()
    record.CopyFrom(RECORD)
    for name, value in fields.items():
        setattr(record, name, value)
    return record


@pytest.fixture
def controls(redis_client: redis.Redis, config: Config) -> Iterator[RolloutControls]:
    redis_client.delete(ROLLOUT_KEY, SHADOW_KEY)
    yield RolloutControls(redis_client, config.cache)
    redis_client.delete(ROLLOUT_KEY, SHADOW_KEY)


@pytest.mark.parametrize("percent", SHADOW_PERCENTS)
def test_the_share_of_hits_compared_is_close_to_the_percentage(percent: int) -> None:
    ids = [uuid.uuid4().hex for _ in range(10_000)]
    rollout = dataclasses.replace(ROLLOUT, shadow=percent)
    compared = sum(rollout.shadowed(i) for i in ids)
    assert abs(compared / len(ids) - percent / 100) <= 0.03


def test_which_hits_are_compared_does_not_follow_which_reads_look_in_the_cache() -> None:
    ids = [uuid.uuid4().hex for _ in range(10_000)]
    rollout = dataclasses.replace(ROLLOUT, percent=50, shadow=50)
    reading = {i for i in ids if rollout.read_format(i)}
    compared = {i for i in ids if rollout.shadowed(i)}
    # Independent halves overlap by about a quarter, not by half.
    assert abs(len(reading & compared) / len(ids) - 0.25) <= 0.03


def test_the_comparison_is_of_fields_not_bytes() -> None:
    assert compare(RECORD, _with()) is Outcome.MATCH
    assert compare(RECORD, _with(revision=8)) is Outcome.BEHIND
    assert compare(RECORD, _with(revision=6)) is Outcome.AHEAD
    assert compare(RECORD, _with(payload=b"other")) is Outcome.PAYLOAD
    assert compare(RECORD, _with(updated_at_unix_ms=2000)) is Outcome.UPDATED_AT
    assert compare(RECORD, None) is Outcome.DELETED
    assert {Outcome.MATCH, Outcome.ABSENT} & MISMATCHES == set()


def test_setting_the_control_clears_the_counts_and_a_bad_value_changes_nothing(
    controls: RolloutControls, redis_client: redis.Redis
) -> None:
    redis_client.hset(SHADOW_KEY, "database:match", 3)
    change = controls.change("alice", shadow=25)
    assert (change.before.shadow, change.after.shadow) == (0, 25)
    assert not redis_client.exists(SHADOW_KEY)
    redis_client.hset(SHADOW_KEY, "database:match", 3)
    controls.change("alice", percent=50)  # another control: the counts stay
    assert redis_client.hget(SHADOW_KEY, "database:match") == b"3"
    for bad in (5, -1, 101, True):
        with pytest.raises(InvalidControl, match="shadow"):
            controls.change("alice", shadow=bad)
    assert controls.fetch().shadow == 25


def test_controls_written_before_the_shadow_control_read_as_none() -> None:
    fields = {k: v for k, v in to_hash(ROLLOUT).items() if k != "shadow"}
    assert from_hash({**fields, "source": "redis"}).shadow == 0


def test_the_status_lines_name_mismatches_by_kind_and_skips_by_cause() -> None:
    lines = describe_counts(
        {
            "database:match": 5,
            "database:payload": 1,
            "database:skipped_permits": 2,
            "database:skipped_busy": 1,
            "database:ms": 1500,
            "formats:match": 4,
            "formats:absent": 2,
        }
    )
    assert lines == [
        "database: 6 compared, 5 matched, 1 mismatch (1 payload); 3 skipped "
        "(2 no free permit, 1 no free slot); 0 failed; 1.5 s holding permits",
        "formats: 6 compared, 4 matched, 0 mismatches, 2 with no entry in the other format; "
        "0 skipped; 0 failed",
    ]

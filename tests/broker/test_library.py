"""The publish interface on Redis (``dataservice/broker/publish.lua``): what
``FCALL ds_publish_v2`` queues is the message Celery's workers take, built in
Redis from the protocol's own terms; bad arguments change nothing; the
configuration it reads is the workers' and comes back when it is gone."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from dataservice.broker import library
from dataservice.broker.base import Request
from dataservice.broker.message import request_message
from dataservice.compat.kombu import queue_entry
from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.errors import Unavailable
from dataservice.limits.admission import SERVICE_STALE_MS, SIZE_HEADER, STANDING_AFTER_MS
from dataservice.redis.keys import (
    CONF_KEY,
    EPOCH_KEY,
    PACE_PREFIX,
    PACING_CONF_KEY,
    admission_key,
    held_key,
)
from tests.client.test_task_message import _strip
from tests.harness.support import with_publish_interface

# No worker serves this database.
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/12"


@pytest.fixture
def unserved(config: Config) -> Iterator[redis.Redis]:
    with with_publish_interface(UNSERVED_REDIS_URL, config) as client:
        yield client


def _publish(client: redis.Redis, *args: Any) -> Any:
    """``FCALL ds_publish_v2`` with ``args``, the request (bytes) in base64."""
    coded = [base64.b64encode(a) if isinstance(a, bytes) else a for a in args]
    return client.execute_command("FCALL", library.PUBLISH, 0, *coded)


def _deadline(seconds: float = 5.0) -> int:
    return int((time.time() + seconds) * 1000)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 255, 256, 257, 1000])
def test_the_queued_message_is_the_one_the_broker_message_module_builds(
    unserved: redis.Redis, config: Config, size: int
) -> None:
    """Field for field, but those that differ between any two messages or
    publishers (the delivery tag, the reply address, the origin)."""
    body = bytes((7 * n + size) % 256 for n in range(size))
    request = Request(
        LaneName.INTERACTIVE, config.lanes.interactive.queue, body, uuid.uuid4().hex,
        "tests", _deadline(), "read", 1, "",
    )  # fmt: skip
    answer = _publish(unserved, "interactive", request.request_id, "tests",
                      request.deadline_ms, "read", 1, body)  # fmt: skip
    assert answer[0] == b""
    (entry,) = unserved.lrange(request.queue, 0, -1)
    expected = request_message(request)
    expected["headers"][SIZE_HEADER] = len(body)
    queued = json.loads(entry)
    assert _strip(queued) == _strip(json.loads(queue_entry(expected)))
    assert queued["properties"]["delivery_tag"].startswith(request.request_id + ".")


def test_a_batch_carries_its_operation_count_and_is_paced_as_one_step(
    unserved: redis.Redis, config: Config
) -> None:
    request_id = uuid.uuid4().hex
    answer = _publish(unserved, "batch", request_id, "tests", _deadline(60), "batch", 20, b"x" * 40)
    assert answer[0] == b""
    (entry,) = unserved.lrange(config.lanes.batch.queue, 0, -1)
    assert json.loads(entry)["headers"]["ds_ops"] == 20
    held = unserved.zrange(held_key(config.lanes.batch.queue), 0, -1)
    assert held == [f"{request_id}:20:40".encode()]


def test_a_caller_over_its_rate_is_refused_and_its_lease_is_granted(
    unserved: redis.Redis, config: Config
) -> None:
    def one(caller: str, *pacing: int) -> Any:
        return _publish(unserved, "interactive", uuid.uuid4().hex, caller, _deadline(), "read", 1,
                        b"x", *pacing)  # fmt: skip

    burst = int(config.callers["tests-limited"].burst)
    assert [one("tests-limited")[0] for _ in range(burst + 1)] == [b""] * burst + [b"rate_limited"]
    # A lease: the rate's headroom taken for the publisher's next publishes.
    assert int(one("tests", 7)[2]) == 7
    # Spending one: the caller's rate is not asked.
    assert one("tests-limited", -1)[0] == b""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["interactive", "a b", "tests", "1", "read", "1", "eA=="], "request id"),
        (["interactive", "ok", "Tests", "1", "read", "1", "eA=="], "caller"),
        (["interactive", "ok", "tests", "soon", "read", "1", "eA=="], "deadline"),
        (["interactive", "ok", "tests", "1", "drop", "1", "eA=="], "operation"),
        (["interactive", "ok", "tests", "1", "read", "0", "eA=="], "ops"),
        (["interactive", "ok", "tests", "1", "read", "101", "eA=="], "more than the lane"),
        (["interactive", "ok", "tests", "1", "read", "1", ""], "base64"),
        (["interactive", "ok", "tests", "1", "read", "1", "\xa2\x06raw!"], "base64"),
        (["interactive", "ok", "tests", "1", "read", "1", 'AAAA"AAA'], "base64"),
        (["interactive", "ok", "tests", "1", "read", "1", "AAAA\\AAA"], "base64"),
        (["interactive", "ok", "tests", "1", "read", "1", "AA==AAAA"], "base64"),
        (["interactive", "ok", "tests", "1", "read", "1", "AAAAA"], "base64"),
        (["interactive", "ok", "tests", "1", "read", "1", "eA==", "-2"], "pacing"),
        (["fast", "ok", "tests", "1", "read", "1", "eA=="], "unknown lane"),
        (["interactive", "ok", "tests", "1", "read", "1"], "arguments"),
    ],
)
def test_bad_arguments_are_an_error_and_change_nothing(
    unserved: redis.Redis, config: Config, args: list[str], says: str
) -> None:
    before = sorted(unserved.keys("*"))
    with pytest.raises(redis.ResponseError, match=f"^dataservice: .*{says}"):
        _publish(unserved, *args)
    assert sorted(unserved.keys("*")) == before
    assert not unserved.exists(admission_key(config.lanes.interactive.queue))


def test_the_configuration_is_the_workers_and_is_installed_again_when_gone(
    unserved: redis.Redis, config: Config
) -> None:
    assert (
        unserved.hget(CONF_KEY, "lane:interactive")
        == library.lane_entry(config, LaneName.INTERACTIVE).encode()
    )
    assert unserved.hexists(PACING_CONF_KEY, "tests-limited")
    assert not library.ensure(unserved, config)
    unserved.delete(CONF_KEY)
    with pytest.raises(redis.ResponseError, match="not configured"):
        _publish(unserved, "interactive", "ok", "tests", _deadline(), "read", 1, b"x")
    assert not unserved.exists(config.lanes.interactive.queue)
    # A client whose user may installs it from its own configuration.
    args = library.publish_args(LaneName.INTERACTIVE, "ok", "tests", _deadline(), "read", 1, b"x")
    assert library.publish(unserved, args, config)[0] == b""
    assert library.ensure(unserved, config) is False


def test_a_client_whose_user_may_not_install_is_told_unavailable(
    unserved: redis.Redis, config: Config
) -> None:
    user = f"ds-test-{uuid.uuid4().hex[:8]}"
    unserved.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"],
                         commands=["+@all", "-function"])  # fmt: skip
    unserved.delete(CONF_KEY)
    limited = redis.Redis.from_url(UNSERVED_REDIS_URL, username=user, password="pw")
    try:
        args = library.publish_args(
            LaneName.INTERACTIVE, "ok", "tests", _deadline(), "read", 1, b"x"
        )
        with pytest.raises(Unavailable, match="no worker has started"):
            library.publish(limited, args, config)
    finally:
        limited.close()
        unserved.acl_deluser(user)


def test_the_library_reads_the_keys_and_figures_the_service_names() -> None:
    assert f"'{CONF_KEY}'" in library.TEXT
    assert f"'{PACING_CONF_KEY}'" in library.TEXT
    assert f"local EPOCH_KEY = '{EPOCH_KEY}'\n" in library.TEXT
    assert f"local PACE_PREFIX = '{PACE_PREFIX}'\n" in library.TEXT
    assert f"local SERVICE_STALE_MS = {SERVICE_STALE_MS}\n" in library.TEXT
    assert f"local STANDING_AFTER_MS = {STANDING_AFTER_MS}\n" in library.TEXT
    assert library.TEXT.startswith(f"#!lua name={library.LIBRARY_NAME}\n")
    assert f"register_function('{library.PUBLISH}'" in library.TEXT


def _with_interactive(config: Config, **changes: Any) -> Config:
    lane = config.lanes.interactive
    admission = {k: v for k, v in changes.items() if k in type(lane.admission).model_fields}
    own = {k: v for k, v in changes.items() if k not in admission}
    interactive = lane.model_copy(
        update={**own, "admission": lane.admission.model_copy(update=admission)}
    )
    lanes = config.lanes.model_copy(update={"interactive": interactive})
    return config.model_copy(update={"lanes": lanes})


def test_a_configuration_written_again_holds_from_the_next_publish(
    unserved: redis.Redis, config: Config
) -> None:
    """The library keeps each lane's entry between calls; written again, the
    new one holds at once."""
    assert _publish(unserved, "interactive", "one", "tests", _deadline(), "read", 1, b"x")[0] == b""
    library.install(unserved, _with_interactive(config, max_messages=1))
    refused = _publish(unserved, "interactive", "two", "tests", _deadline(), "read", 1, b"x")
    assert refused[0] == b"queue_full"
    library.install(unserved, config)
    assert (
        _publish(unserved, "interactive", "three", "tests", _deadline(), "read", 1, b"y")[0] == b""
    )


def test_each_database_of_a_server_publishes_by_its_own_configuration(
    unserved: redis.Redis, config: Config
) -> None:
    other_url = UNSERVED_REDIS_URL.rsplit("/", 1)[0] + "/13"
    other = redis.Redis.from_url(other_url)
    renamed = _with_interactive(config, queue="interactive-elsewhere")
    try:
        other.flushdb()
        library.install(other, renamed)
        for n in range(3):
            for client in (unserved, other):
                answer = _publish(client, "interactive", f"r{n}", "tests", _deadline(), "read", 1,
                                  b"x")  # fmt: skip
                assert answer[0] == b""
        assert unserved.llen(config.lanes.interactive.queue) == 3
        assert other.llen("interactive-elsewhere") == 3
        assert not other.exists(config.lanes.interactive.queue)
    finally:
        other.flushdb()
        other.close()


def test_a_callers_rate_is_read_once_per_configuration_and_a_new_one_holds_at_once(
    unserved: redis.Redis, config: Config
) -> None:
    """The library keeps the callers' rates it read under the digest of
    ``ds:conf:pacing`` in the lane's entry: one ``HGET`` per caller and
    configuration, and a configuration written again is followed from the
    next publish."""

    def one(caller: str) -> Any:
        return _publish(unserved, "interactive", uuid.uuid4().hex, caller, _deadline(), "read", 1,
                        b"x")  # fmt: skip

    def hgets() -> int:
        return int(unserved.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))

    assert one("tests")[0] == b""
    before = hgets()
    assert [one("tests")[0] for _ in range(5)] == [b""] * 5
    assert hgets() == before
    # A caller without a rate is looked up each time, and never kept.
    assert one("nobody-configured")[0] == b""
    assert hgets() == before + 1
    policy = config.callers["tests"].model_copy(update={"rate_per_s": 0.1, "burst": 1})
    callers = {**config.callers, "tests": policy}
    library.install(unserved, config.model_copy(update={"callers": callers}))
    assert [one("tests")[0] for _ in range(2)] == [b"", b"rate_limited"]


def test_a_lane_entry_of_the_version_before_serves_with_its_rates_read_each_time(
    unserved: redis.Redis, config: Config
) -> None:
    """Workers of the version before wrote entries without the rates' digest:
    the library serves by them during an upgrade, reading a caller's rate on
    every publish."""
    older = {
        field: "\t".join(entry.split("\t")[:-1])
        for field, entry in library.conf_fields(config).items()
        if field.startswith("lane:")
    }
    unserved.hset(CONF_KEY, mapping=older)
    for lane in ("interactive", "batch"):
        unserved.hdel(admission_key(config.lanes[LaneName(lane)].queue), "conf")
    before = int(unserved.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))
    for n in range(3):
        answer = _publish(unserved, "interactive", f"old{n}", "tests", _deadline(), "read", 1, b"x")
        assert answer[0] == b""
    # The lane's entry once, and the caller's rate on each publish.
    assert int(unserved.info("commandstats")["cmdstat_hget"]["calls"]) - before == 4

"""The cache's rollout controls, against the real Redis: what replicas see,
what a change records, what a bad value or a silent Redis does, and the
``dataservice cache`` commands an operator runs."""

from __future__ import annotations

import getpass
import itertools
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import free_port
from dataservice_tools.testkit.waits import eventually
from redis.backoff import NoBackoff
from redis.retry import Retry
from typer.testing import CliRunner

from dataservice.cache.controls import RolloutControls
from dataservice.cache.rollout import PERCENTS, Rollout, parse_format, parse_formats
from dataservice.cli import app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import CacheFormat
from dataservice.errors import ConfigError, InvalidControl, ServiceSetupError
from dataservice.redis.keys import AUDIT_KEY, ROLLOUT_KEY
from tests.conftest import require

V1, V2 = CacheFormat.V1, CacheFormat.V2
# redis-py retries a refused connection for seconds by default; these tests want the refusal.
NO_RETRY = Retry(NoBackoff(), retries=0)
BOTH = frozenset({V1, V2})


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000


@pytest.fixture(autouse=True)
def _no_controls_yet(redis_client: redis.Redis) -> Iterator[None]:
    redis_client.delete(ROLLOUT_KEY, AUDIT_KEY)
    yield
    redis_client.delete(ROLLOUT_KEY, AUDIT_KEY)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def controls(redis_client: redis.Redis, config: Config, clock: Clock) -> RolloutControls:
    return RolloutControls(redis_client, config.cache, clock)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[redis.Redis, subprocess.Popen[bytes]]]:
    """A redis-server of the test's own, to stop or to count the commands it ran."""
    require(shutil.which("redis-server") is not None, "redis-server")
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5, retry=NO_RETRY)
    try:

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        eventually(answers, timeout=10, interval=0.02, message="redis-server to start")
        yield client, server
    finally:
        client.close()
        server.terminate()
        server.wait(10)


def _stored(client: redis.Redis) -> tuple[dict[bytes, bytes], int]:
    return client.hgetall(ROLLOUT_KEY), client.xlen(AUDIT_KEY)


# What a replica sees ----------------------------------------------------------


def test_defaults_apply_while_redis_holds_nothing(
    controls: RolloutControls, config: Config
) -> None:
    rollout = controls.current()
    defaults = config.cache.rollout
    assert (rollout.fill, rollout.read, rollout.percent) == (
        defaults.fill,
        defaults.read,
        defaults.percent,
    )
    assert (rollout.bypass, rollout.generation, rollout.rotated_at_ms) == (False, 1, 0)
    assert rollout.source == "defaults"
    assert controls.fetch() == rollout
    assert controls.history() == []


def test_a_change_persists_and_every_replica_sees_it_within_the_max_age(
    redis_client: redis.Redis, config: Config, controls: RolloutControls, clock: Clock
) -> None:
    other_clock = Clock()
    other = RolloutControls(redis_client, config.cache, other_clock)
    assert other.current().fill == BOTH

    change = controls.change("alice", fill=frozenset(), read=V1, percent=25, bypass=True)
    assert change.before.source == "defaults"
    assert change.after == Rollout(frozenset(), V1, 25, True, 0, 1, 0, "redis")
    # The replica that made the change acts on it at once.
    assert controls.current() == change.after
    other_clock.advance_ms(config.cache.controls_max_age_ms)
    assert other.current() == change.after
    # And it outlives the replicas: a new one reads it from Redis.
    assert RolloutControls(redis_client, config.cache).current() == change.after


def test_a_change_sets_only_the_controls_it_names(controls: RolloutControls) -> None:
    controls.change("alice", percent=10)
    after = controls.change("alice", read=None).after
    assert (after.read, after.percent, after.fill) == (None, 10, BOTH)
    assert controls.change("alice", bypass=True).after.percent == 10


def test_rotation_moves_to_the_next_generation_and_records_when(
    redis_client: redis.Redis, config: Config, controls: RolloutControls
) -> None:
    controls.change("alice", percent=50)
    started_ms = time.time() * 1000
    first = controls.rotate("bob").after
    second = controls.rotate("bob").after
    assert (first.generation, second.generation) == (2, 3)
    assert started_ms - 1000 <= first.rotated_at_ms <= second.rotated_at_ms
    assert second.rotated_at_ms <= time.time() * 1000 + 1000
    assert second.percent == 50
    assert RolloutControls(redis_client, config.cache).current().generation == 3


def test_every_change_is_audited_with_who_before_and_after(
    redis_client: redis.Redis, controls: RolloutControls
) -> None:
    controls.change("alice", fill=frozenset({V2}))
    controls.rotate("bob")
    newest, oldest = controls.history()
    assert (oldest.who, oldest.action) == ("alice", "change")
    assert (oldest.before.fill, oldest.after.fill) == (BOTH, frozenset({V2}))
    assert oldest.before.source == "defaults"
    assert (newest.who, newest.action) == ("bob", "rotate")
    assert (newest.before.generation, newest.after.generation) == (1, 2)
    assert newest.at_ms == newest.after.rotated_at_ms
    assert newest.at_ms >= oldest.at_ms
    assert [entry.id for entry in controls.history(limit=1)] == [newest.id]
    assert redis_client.xlen(AUDIT_KEY) == 2


def test_the_audit_stream_stays_bounded(
    redis_client: redis.Redis, controls: RolloutControls
) -> None:
    for n in range(1200):
        controls.change("alice", bypass=n % 2 == 0)
    # MAXLEN ~ trims whole stream nodes (100 entries by default) at a time.
    assert 1000 <= redis_client.xlen(AUDIT_KEY) <= 1100


@pytest.mark.parametrize(
    "bad",
    [
        {"percent": 33},
        {"percent": 0},
        {"percent": True},
        {"fill": frozenset({"v3"})},
        {"read": "json"},
        {},
    ],
    ids=["percent-33", "percent-0", "percent-bool", "fill-v3", "read-json", "nothing"],
)
def test_a_bad_value_raises_and_changes_nothing(
    redis_client: redis.Redis, controls: RolloutControls, bad: dict[str, object]
) -> None:
    controls.change("alice", percent=25)
    before = _stored(redis_client)
    with pytest.raises(InvalidControl) as raised:
        controls.change("mallory", **bad)  # type: ignore[arg-type]
    assert isinstance(raised.value, ConfigError)
    assert _stored(redis_client) == before
    assert controls.current().percent == 25


def test_operator_spellings_parse_and_bad_ones_raise() -> None:
    assert parse_formats("v1,v2") == parse_formats("v2, v1") == BOTH
    assert parse_formats("none") == frozenset()
    assert (parse_format("v2"), parse_format("none")) == (V2, None)
    for bad in ("v1,v3", "", "all"):
        with pytest.raises(InvalidControl, match="fill"):
            parse_formats(bad)
    with pytest.raises(InvalidControl, match="read"):
        parse_format("v1,v2")


def test_reading_a_format_that_is_not_filled_is_allowed(controls: RolloutControls) -> None:
    after = controls.change("alice", fill=frozenset()).after
    assert after.read == V2
    assert after.reads_unfilled
    assert not controls.change("alice", fill=frozenset({V2})).after.reads_unfilled


# When Redis does not answer ---------------------------------------------------


def test_current_keeps_the_last_values_when_redis_stops_answering(
    private_redis: tuple[redis.Redis, subprocess.Popen[bytes]], config: Config, clock: Clock
) -> None:
    client, server = private_redis
    RolloutControls(client, config.cache).change("alice", bypass=True, percent=10)
    controls = RolloutControls(client, config.cache, clock)
    seen = controls.current()
    assert (seen.bypass, seen.percent, seen.source) == (True, 10, "redis")
    server.terminate()
    server.wait(10)
    for _ in range(3):
        clock.advance_ms(config.cache.controls_max_age_ms)
        assert controls.current() == seen
    with pytest.raises(ServiceSetupError):
        controls.rotate("alice")


def test_a_redis_that_never_answered_leaves_the_defaults(config: Config, clock: Clock) -> None:
    closed = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=NO_RETRY)
    controls = RolloutControls(closed, config.cache, clock)
    assert controls.current() == controls.defaults
    with pytest.raises(ServiceSetupError):
        controls.change("alice", bypass=True)
    with pytest.raises(ServiceSetupError):
        controls.history()


def test_current_reads_redis_at_most_once_per_max_age(
    private_redis: tuple[redis.Redis, subprocess.Popen[bytes]], config: Config, clock: Clock
) -> None:
    client, _ = private_redis
    controls = RolloutControls(client, config.cache, clock)

    def reads() -> int:
        stats = client.info("commandstats").get("cmdstat_hgetall", {"calls": 0})
        return int(stats["calls"])

    for _ in range(1000):
        controls.current()
    assert reads() == 1
    clock.advance_ms(config.cache.controls_max_age_ms)
    for _ in range(1000):
        controls.current()
    assert reads() == 2


# Which reads look in the cache -------------------------------------------------


def _rollout(percent: int, *, read: CacheFormat | None = V2, bypass: bool = False) -> Rollout:
    return Rollout(BOTH, read, percent, bypass, 0, 1, 0, "redis")


def test_a_request_id_gets_the_same_answer_on_every_replica() -> None:
    ids = [uuid.uuid4().hex for _ in range(1000)]
    first = [_rollout(50).read_format(i) for i in ids]
    assert first == [_rollout(50).read_format(i) for i in ids]
    assert set(first) == {V2, None}


@pytest.mark.parametrize("percent", PERCENTS)
def test_the_share_of_reads_that_look_in_the_cache_is_close_to_the_percentage(
    percent: int,
) -> None:
    ids = [uuid.uuid4().hex for _ in range(10_000)]
    reading = sum(_rollout(percent).read_format(i) is V2 for i in ids)
    assert abs(reading / len(ids) - percent / 100) <= 0.03


def test_raising_the_percentage_only_adds_reads() -> None:
    ids = [uuid.uuid4().hex for _ in range(10_000)]
    shares = [{i for i in ids if _rollout(p).read_format(i)} for p in PERCENTS]
    assert all(smaller <= larger for smaller, larger in itertools.pairwise(shares))


def test_bypass_means_no_cache_reads_and_no_fills() -> None:
    bypassed = _rollout(100, bypass=True)
    assert bypassed.fill_formats() == frozenset()
    assert bypassed.read_format("r1") is None
    assert _rollout(100, read=None).read_format("r1") is None
    assert _rollout(100).fill_formats() == BOTH


# The commands -----------------------------------------------------------------


def _cli(settings: Settings, *args: str, **env: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["cache", *args], env={**settings.to_env(), **env})
    # An error is reported and exits; it never escapes as a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, result.stderr


def test_each_command_prints_before_after_and_who(
    settings: Settings, redis_client: redis.Redis, controls: RolloutControls
) -> None:
    who = getpass.getuser()
    for args, printed in [
        (("fill", "none"), "fill: v1,v2 -> none"),
        (("read", "v1", "--percent", "25"), "read: v2 -> v1, percent: 100 -> 25"),
        (("bypass", "on"), "bypass: off -> on"),
        (("rotate",), "generation: 1 -> 2"),
        (("bypass", "off"), "bypass: on -> off"),
        (("fill", "v1,v2"), "fill: none -> v1,v2"),
    ]:
        code, out, err = _cli(settings, *args)
        assert code == 0, err
        assert out.strip() == f"{printed} (by {who})"
    assert controls.fetch() == Rollout(
        BOTH, V1, 25, False, 0, 2, controls.fetch().rotated_at_ms, "redis"
    )
    assert {entry.who for entry in controls.history()} == {who}


def test_status_shows_the_values_their_source_and_warns_of_an_unfilled_read(
    settings: Settings, controls: RolloutControls
) -> None:
    code, out, err = _cli(settings, "status")
    assert code == 0, err
    assert "nothing in Redis yet" in out
    assert "warning" not in err

    controls.change("alice", fill=frozenset({V1}))
    code, out, err = _cli(settings, "status")
    assert code == 0, err
    assert "from Redis" in out
    assert "alice" in out
    assert "fill: v1,v2 -> v1" in out
    assert "warning: reads look in v2, which no fill writes" in err

    code, out, err = _cli(settings, "status", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["controls"] == {
        "fill": ["v1"], "read": "v2", "percent": 100, "bypass": False, "shadow": 0,
        "generation": 1, "rotated_at_ms": 0, "source": "redis",
    }  # fmt: skip
    assert len(status["warnings"]) == 1
    assert [entry["who"] for entry in status["history"]] == ["alice"]


@pytest.mark.parametrize(
    "args",
    [("fill", "v3"), ("read", "v1", "--percent", "33"), ("read", "json")],
    ids=["fill-v3", "percent-33", "read-json"],
)
def test_a_bad_value_exits_2_with_the_error_and_changes_nothing(
    settings: Settings, redis_client: redis.Redis, args: tuple[str, ...]
) -> None:
    code, _out, err = _cli(settings, *args)
    assert code == 2
    assert err.startswith("error: ")
    assert _stored(redis_client) == ({}, 0)


def test_a_redis_that_does_not_answer_exits_1_with_a_clear_error(settings: Settings) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/15"
    for args in (("status",), ("rotate",), ("bypass", "on")):
        code, out, err = _cli(settings, *args, DATASERVICE_REDIS_URL=url)
        assert code == 1
        assert err.startswith("error: ")
        assert "Redis" in err
        assert "hunter2" not in out + err

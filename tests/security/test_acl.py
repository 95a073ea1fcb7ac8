"""Redis users: a caller's user publishes and takes its own answers, nothing
more; the workers' user reaches everything but the dangerous commands."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
import redis
import yaml
from dataservice_tools.localservices.sentinel import SentinelGroup
from dataservice_tools.testkit.waits import eventually
from redis.exceptions import NoPermissionError, ResponseError

from dataservice import Client
from dataservice.client.inbox import Inbox
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ServiceSetupError
from dataservice.limits.admission import SIZE_HEADER, admit, lane_admission_bounds
from dataservice.proto import pb
from dataservice.redis.keys import inflight_key, rate_key, replay_key, reply_key, result_key
from dataservice.security.acl import (
    WORKER_USER,
    acl_users,
    apply_acl,
    apply_from_settings,
    caller_user,
)
from dataservice.security.callers import KeyRing, load_keyring
from tests.conftest import require

CALLER = "tests"


def _as_user(url: str, user: str, password: bytes) -> str:
    parts = urlsplit(url)
    netloc = f"{user}:{quote(password.decode(), safe='')}@{parts.hostname}:{parts.port or 6379}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture(scope="module")
def keyring(settings: Settings) -> KeyRing:
    return load_keyring(settings.callers_file)


@pytest.fixture(scope="module")
def users(redis_client: redis.Redis, keyring: KeyRing, config: Config) -> Iterator[list[str]]:
    names = apply_acl(redis_client, keyring, config)
    yield names
    redis_client.acl_deluser(*names)


@pytest.fixture(scope="module")
def caller_url(settings: Settings, keyring: KeyRing, users: list[str]) -> str:
    return _as_user(settings.broker_url, caller_user(CALLER), keyring.redis_passwords[CALLER].value)


@pytest.fixture
def as_caller(caller_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(caller_url)
    yield client
    client.close()


@pytest.fixture
def as_worker(settings: Settings, keyring: KeyRing, users: list[str]) -> Iterator[redis.Redis]:
    assert keyring.workers_redis_password is not None
    client = redis.Redis.from_url(
        _as_user(settings.broker_url, WORKER_USER, keyring.workers_redis_password.value)
    )
    yield client
    client.close()


def _refusals(admin: redis.Redis, user: str) -> dict[tuple[str, str, str], int]:
    return {
        (str(entry["reason"]), str(entry["context"]), str(entry["object"])): int(
            str(entry["count"])
        )
        for entry in admin.acl_log()
        if entry["username"] == user
    }


def test_every_caller_with_a_password_and_the_workers_get_a_user(
    users: list[str], keyring: KeyRing
) -> None:
    expected = {caller_user(name) for name in keyring.redis_passwords} | {WORKER_USER}
    assert set(users) == expected
    assert caller_user(CALLER) in users


def test_a_caller_round_trip_needs_nothing_its_user_is_refused(
    settings: Settings,
    config: Config,
    interactive_worker: Any,
    redis_client: redis.Redis,
    caller_url: str,
    scope: str,
) -> None:
    # A server that has not seen the admission script yet makes the publisher
    # fall back from EVALSHA to EVAL; that path must be allowed too.
    redis_client.script_flush()
    before = _refusals(redis_client, caller_user(CALLER))
    as_caller = dataclasses.replace(settings, broker_url=caller_url, result_backend_url=caller_url)
    with Client(CALLER, as_caller, config) as client:
        written = client.write(scope, "alpha", b"payload")
        record = client.read(scope, "alpha")
    assert (record.revision, record.payload) == (written.revision, b"payload")
    # redis-py swallows some refusals (CLIENT SETINFO); the ACL log still counts them.
    after = _refusals(redis_client, caller_user(CALLER))
    assert {k: n for k, n in after.items() if n > before.get(k, 0)} == {}


def test_a_callers_publish_that_finds_lapsed_requests_needs_nothing_its_user_is_refused(
    config: Config, redis_client: redis.Redis, caller_url: str
) -> None:
    """Admission looks for lapsed requests, and for the next to lapse, inside
    the publish: as the caller's user too."""
    lane = lane_admission_bounds(config)[config.lanes.batch.queue]
    now_ms = int(redis_client.time()[0]) * 1000
    redis_client.zadd(lane.held_key, {"lost:100": now_ms - 1, "kept:100": now_ms + 60_000})
    redis_client.hset(lane.stats_key, mapping={"held": 2, "bytes": 200, "lapse_at": now_ms - 1})
    before = _refusals(redis_client, caller_user(CALLER))
    message = {
        "body": "e30=",
        "properties": {"body_encoding": "base64"},
        "headers": {"id": uuid.uuid4().hex, SIZE_HEADER: 2},
    }
    with redis.Redis.from_url(caller_url) as client:
        admit(client, config.lanes.batch.queue, lane, "acl-test", message)
    try:
        assert redis_client.zscore(lane.held_key, "lost:100") is None
        assert redis_client.hget(lane.stats_key, "held") == b"2"
        after = _refusals(redis_client, caller_user(CALLER))
        assert {k: n for k, n in after.items() if n > before.get(k, 0)} == {}
    finally:
        redis_client.lrem(config.lanes.batch.queue, 1, "acl-test")
        redis_client.delete(lane.held_key, lane.stats_key)


def test_a_caller_reaches_its_own_result_keys(as_caller: redis.Redis) -> None:
    key = result_key(CALLER, uuid.uuid4().hex)
    assert as_caller.exists(key) == 0
    assert as_caller.lpop(key) is None
    assert as_caller.blpop([key], timeout=0.01) is None


def test_a_caller_reads_its_own_reply_channels(as_caller: redis.Redis) -> None:
    key = reply_key(CALLER, uuid.uuid4().hex)
    assert as_caller.llen(key) == 0
    assert as_caller.lpop(key) is None
    assert as_caller.blpop([key], timeout=0.01) is None


def test_a_callers_inbox_reads_its_channel_as_the_caller(
    caller_url: str, redis_client: redis.Redis
) -> None:
    before = _refusals(redis_client, caller_user(CALLER))
    inbox = Inbox(caller_url, CALLER)
    try:
        inbox.expect("r-1", 10)
        redis_client.rpush(
            reply_key(CALLER, inbox.channel),
            pb.ResponseEnvelope(request_id="r-1").SerializeToString(),
        )
        assert inbox.wait("r-1", 5) is not None
    finally:
        inbox.close()
    after = _refusals(redis_client, caller_user(CALLER))
    assert {k: n for k, n in after.items() if n > before.get(k, 0)} == {}


_OTHER_KEYS = [
    "record:v2:some-scope:some-id",
    "record:v1:some-scope:some-id",
    rate_key(CALLER),
    replay_key(CALLER, "x"),
    inflight_key(CALLER),
    "ds:lock:record:x",
    result_key("tests-narrow", "x"),
    reply_key("tests-narrow", "x"),
]


@pytest.mark.parametrize("key", _OTHER_KEYS)
@pytest.mark.parametrize("command", [("GET",), ("SET", "v"), ("DEL",)], ids=lambda c: c[0])
def test_a_caller_cannot_touch_keys_that_are_not_its_own(
    as_caller: redis.Redis, key: str, command: tuple[str, ...]
) -> None:
    with pytest.raises(NoPermissionError):
        as_caller.execute_command(command[0], key, *command[1:])


@pytest.mark.parametrize("lane", list(LaneName))
@pytest.mark.parametrize(
    "command", [("LRANGE", 0, -1), ("LPOP",), ("RPOP",), ("LINDEX", 0)], ids=lambda c: c[0]
)
def test_a_caller_cannot_read_the_lane_queues(
    as_caller: redis.Redis, config: Config, lane: LaneName, command: tuple[Any, ...]
) -> None:
    with pytest.raises(NoPermissionError):
        as_caller.execute_command(command[0], config.lanes[lane].queue, *command[1:])


def test_a_callers_script_reaches_no_more_than_the_caller(
    as_caller: redis.Redis, config: Config
) -> None:
    queue = config.lanes.interactive.queue
    with pytest.raises(ResponseError, match="can't run this command"):
        as_caller.eval("return redis.call('LRANGE', KEYS[1], 0, -1)", 1, queue)
    with pytest.raises(NoPermissionError):
        as_caller.eval("return redis.call('GET', KEYS[1])", 1, rate_key(CALLER))


@pytest.mark.parametrize(
    "command", [("KEYS", "*"), ("SCAN", 0), ("FLUSHDB",), ("PUBLISH", "celery", "x")]
)
def test_a_caller_cannot_list_wipe_or_broadcast(
    as_caller: redis.Redis, command: tuple[Any, ...]
) -> None:
    with pytest.raises(NoPermissionError):
        as_caller.execute_command(*command)


def test_the_workers_reach_every_key_but_no_dangerous_command(as_worker: redis.Redis) -> None:
    # Names of their own, so the shared limits of the test callers stay untouched.
    unique = f"acl-{uuid.uuid4().hex[:8]}"
    keys = [
        f"record:v2:{unique}:x",
        rate_key(unique),
        replay_key(unique, "x"),
        f"ds:lock:record:{unique}",
        result_key(unique, "x"),
    ]
    for key in keys:
        assert as_worker.set(key, "v")
        assert as_worker.get(key) == b"v"
    assert as_worker.delete(*keys) == len(keys)
    for command in (("KEYS", "*"), ("FLUSHDB",), ("CONFIG", "GET", "maxmemory"), ("ACL", "LIST")):
        with pytest.raises(NoPermissionError):
            as_worker.execute_command(*command)


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataservice.cli", "acl", *args],
        env={**os.environ, **settings.to_env()},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _secrets(settings: Settings) -> list[str]:
    """Every password and signing secret in the callers file, as written there."""
    assert settings.callers_file is not None
    data = yaml.safe_load(settings.callers_file.read_text())
    found = [data["workers"]["redis_password"]]
    for entry in data["callers"].values():
        found += [key["secret"] for key in entry["keys"]]
        found += [entry["redis_password"]] if "redis_password" in entry else []
    return found


def test_acl_show_prints_every_user_and_no_secret(
    settings: Settings, keyring: KeyRing, users: list[str]
) -> None:
    shown = _cli(settings, "show")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [line.split()[2] for line in lines] == users
    assert all(" ><password> " in line for line in lines)
    for secret in _secrets(settings):
        assert secret not in shown.stdout + shown.stderr


def test_acl_apply_prints_names_only(settings: Settings, users: list[str]) -> None:
    applied = _cli(settings, "apply")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.split() == users
    for secret in _secrets(settings):
        assert secret not in applied.stdout + applied.stderr


def test_shown_commands_set_the_same_users_through_redis_cli(
    settings: Settings,
    config: Config,
    keyring: KeyRing,
    redis_client: redis.Redis,
    users: list[str],
) -> None:
    cli = shutil.which("redis-cli")
    require(cli is not None, "redis-cli")
    assert cli is not None
    applied = {name: redis_client.acl_getuser(name) for name in users}
    passwords = {user.name: user.password.value.decode() for user in acl_users(keyring, config)}
    lines = _cli(settings, "show").stdout.splitlines()
    script = "".join(
        line.replace("<password>", passwords[line.split()[2]]) + "\n" for line in lines
    )
    parts = urlsplit(settings.redis_url)
    done = subprocess.run(
        [cli, "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)],
        input=script, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["OK"] * len(users), done.stderr
    assert {name: redis_client.acl_getuser(name) for name in users} == applied


@pytest.mark.fault
def test_acl_apply_on_a_sentinel_url_sets_the_users_on_the_primary_and_its_replica(
    settings: Settings, keyring: KeyRing, tmp_path: Path
) -> None:
    with SentinelGroup(tmp_path) as group:
        on_group = dataclasses.replace(settings, redis_url=group.url())
        names = apply_from_settings(on_group)
        assert WORKER_USER in names
        for server in group.servers:
            client = redis.Redis.from_url(server.url)
            try:
                assert set(names) <= set(client.acl_users())
            finally:
                client.close()

        # A replica the Sentinel calls down is still named, and the primary
        # gets the users all the same.
        replica = group.replica()
        replica.signal(signal.SIGKILL)
        eventually(lambda: _called_down(group, replica.port), timeout=10,
                   message="the Sentinel to call the replica down")  # fmt: skip
        primary = redis.Redis.from_url(group.server_on(group.primary_port() or 0).url)
        try:
            primary.acl_deluser(*names)
            with pytest.raises(ServiceSetupError, match=f":{replica.port} \\(replica\\)"):
                apply_from_settings(on_group)
            assert set(names) <= set(primary.acl_users())
        finally:
            primary.close()


def _called_down(group: SentinelGroup, port: int) -> bool:
    sentinel = redis.Redis(port=group.sentinel_port)
    try:
        replicas = sentinel.sentinel_slaves(group.name)
    finally:
        sentinel.close()
    return any(int(r["port"]) == port and "s_down" in r["flags"] for r in replicas)

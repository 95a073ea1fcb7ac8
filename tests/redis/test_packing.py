"""Commands packed by hiredis in one call (``dataservice/redis/packing.py``) are the
bytes redis-py would have sent, and a command that is not plain goes redis-py's
way: against the real Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import hiredis
import pytest
import redis

from dataservice.broker.redis import RedisTransport
from dataservice.redis.bounded import BoundedConnection
from dataservice.redis.packing import PackedConnection, packed_connection_class

URL = "redis://127.0.0.1:6379/8"

PLAIN = [
    ("GET", ""),
    ("SET", "k", 5),
    ("SET", "ü", "é"),
    ("SET", "k", -(2**63)),
    ("SET", "k", 2**70),
    ("EVALSHA", "abc", 2, "k1", b"\x00\xff\r\n", -7, 0),
    ("ZADD", "k", 1796376044.2630155, "m", 0.1, "n", -0.0, "o", 1e-07, "p", 1e20, "q"),
    ("ZADD", "k", *(x for n in range(-300, 300) for x in (10.0**n / 7, f"m{n}"))),
    ("MGET", *(f"key-{n}" for n in range(4_000))),
]


@pytest.mark.parametrize("args", PLAIN, ids=lambda args: f"{args[0]}-{len(args)}")
def test_hiredis_packs_plain_arguments_as_redis_py_does(args: tuple[object, ...]) -> None:
    assert hiredis.pack_command(args) == b"".join(redis.Connection().pack_command(*args))


@pytest.fixture
def packed() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(URL, connection_class=packed_connection_class(URL))
    yield client
    client.flushdb()
    client.close()


def test_a_packed_client_round_trips_every_kind_of_argument(packed: redis.Redis) -> None:
    key = f"packing-{uuid.uuid4().hex}"
    assert isinstance(packed.connection_pool.get_connection(), PackedConnection)
    packed.set(key, "é\x00ü")
    assert packed.get(key) == "é\x00ü".encode()
    packed.set(key, b"\xff\r\n")
    assert packed.get(key) == b"\xff\r\n"
    packed.set(key, 2**70)
    assert packed.get(key) == str(2**70).encode()
    packed.set(key, 1.5)
    assert packed.get(key) == b"1.5"
    # Not plain: redis-py's own packing, with its own rules.
    with pytest.raises(redis.DataError):
        packed.set(key, True)  # type: ignore[arg-type]
    assert packed.client_setname("packing")  # "CLIENT SETNAME": a command of two words
    keys = [f"{key}:{n}" for n in range(4_000)]
    script = "for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1]) end return #KEYS"
    assert packed.eval(script, len(keys), *keys, "v") == 4_000
    assert packed.mget(keys[::1_000]) == [b"v"] * 4


def test_the_service_connections_are_packed() -> None:
    assert issubclass(BoundedConnection, PackedConnection.__mro__[1])
    assert RedisTransport.Channel.connection_class is PackedConnection
    assert packed_connection_class("rediss://h:1/0").__mro__[1] is PackedConnection.__mro__[1]

"""Every redis-py internal the service relies on (``dataservice/compat/redis.py``),
pinned: its name and signature, and its behaviour on the real Redis through
the hooks the service uses, so that an upgrade that changes one fails here
and not as a call that waits past its caller's deadline."""

from __future__ import annotations

import asyncio
import inspect
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
import redis.asyncio
import redis.sentinel
from dataservice_tools.localservices import PrivateRedis, redis_reachable
from redis.asyncio import connection as async_connection
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.retry import Retry

from dataservice.compat import redis as compat
from tests.conftest import TEST_REDIS_URL, require


def _params(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.fixture
def key() -> Iterator[str]:
    """A key of the test's own, deleted afterwards."""
    require(redis_reachable(TEST_REDIS_URL), "Redis at 127.0.0.1:6379")
    own = f"compat-redis-{uuid.uuid4().hex[:12]}"
    yield own
    client = redis.Redis.from_url(TEST_REDIS_URL)
    client.delete(own)
    client.close()


def test_redis_py_private_names_keep_their_signatures() -> None:
    made = redis.Connection(socket_timeout=3.0, socket_connect_timeout=2.0)
    assert (vars(made)["_socket_timeout"], vars(made)["_socket_connect_timeout"]) == (3.0, 2.0)
    for name in ("socket_timeout", "socket_connect_timeout"):
        assert isinstance(inspect.getattr_static(redis.Connection, name), property)
    assert _params(AbstractConnection._get_socket) == ["self"]
    assert made._get_socket() is None
    assert _params(AbstractConnection.update_current_socket_timeout) == ["self", "relaxed_timeout"]
    assert "relaxed_timeout != -1 else self.socket_timeout" in inspect.getsource(
        AbstractConnection.update_current_socket_timeout
    )
    assert _params(AbstractConnection.send_packed_command) == ["self", "command", "check_health"]
    assert _params(AbstractConnection.send_command) == ["self", "args", "kwargs"]
    assert _params(async_connection.AbstractConnection.pack_command) == ["self", "args"]
    assert "self.pack_command(*cmd)" in inspect.getsource(
        async_connection.AbstractConnection.pack_commands
    )
    for connection in (made, redis.asyncio.Connection()):
        assert (connection.encoder.encoding, connection.encoder.encoding_errors) == (
            "utf-8",
            "strict",
        )
    pool = redis.BlockingConnectionPool(timeout=7)
    assert pool.timeout == 7
    assert "timeout=self.timeout" in inspect.getsource(redis.BlockingConnectionPool.get_connection)
    pool.disconnect()


def test_a_sentinels_client_connects_with_the_class_set_on_its_pool(key: str) -> None:
    """redis-py builds each Sentinel's client with no connection class of its
    own choosing; set on its pool before it connects, its connections are of it."""
    manager = redis.sentinel.Sentinel([("127.0.0.1", 6379)])
    (sentinel,) = manager.sentinels
    compat.use_connection_class(sentinel, _Bound)
    try:
        assert sentinel.ping()
        made = sentinel.connection_pool.get_connection()
        try:
            assert type(made) is _Bound
        finally:
            sentinel.connection_pool.release(made)
    finally:
        sentinel.close()


class _Hooks(compat.TimeoutHooks):
    bound: float | None = None
    refuse = False

    def bound_timeout(self, configured: float | None) -> float | None:
        return configured if self.bound is None else self.bound

    def before_send(self) -> None:
        if self.refuse:
            raise redis.TimeoutError("refused before sending")


class _Bound(_Hooks, redis.Connection):
    pass


class _UnixBound(_Hooks, redis.UnixDomainSocketConnection):
    pass


def test_an_open_connection_reads_its_timeout_through_the_hook_at_each_command(key: str) -> None:
    client = redis.Redis.from_url(TEST_REDIS_URL, connection_class=_Bound, socket_timeout=5)
    try:
        connection = client.connection_pool.get_connection()
        client.connection_pool.release(connection)
        assert isinstance(connection, _Bound)
        assert client.ping()
        socket = connection._get_socket()
        assert socket is not None
        assert socket.gettimeout() == 5
        _Bound.bound = 0.1
        started = time.monotonic()
        # Without the hook's timeout armed on the open socket, this waits 2 s
        # for a list that never fills and answers None.
        with pytest.raises(redis.TimeoutError):
            client.blpop([key], timeout=2)
        assert time.monotonic() - started < 1.5
    finally:
        _Bound.bound = None
        client.close()


def test_a_connection_made_inside_a_bound_connects_with_it() -> None:
    require(redis_reachable(TEST_REDIS_URL), "Redis at 127.0.0.1:6379")
    _Bound.bound = 0.25
    connection = _Bound(host="127.0.0.1", port=6379, db=15, socket_timeout=5)
    try:
        connection.connect()
        socket = connection._get_socket()
        assert socket is not None
        assert socket.gettimeout() == 0.25
        assert connection.socket_connect_timeout == 0.25
    finally:
        _Bound.bound = None
        connection.disconnect()
    assert connection.socket_timeout == 5


def test_a_command_refused_before_sending_is_not_sent(key: str) -> None:
    client = redis.Redis.from_url(TEST_REDIS_URL, connection_class=_Bound)
    try:
        client.ping()
        _Bound.refuse = True
        with pytest.raises(redis.TimeoutError, match="refused before sending"):
            client.set(key, "sent")
    finally:
        _Bound.refuse = False
    assert client.get(key) is None
    client.close()


def test_a_blocking_pool_waits_for_a_connection_through_the_hook() -> None:
    class Waiting(compat.WaitingPool):
        def bound_wait(self, configured: float | None) -> float | None:
            return 0.05

    pool = Waiting(max_connections=1, timeout=5)
    assert pool.timeout == 0.05
    held = pool.get_connection()
    started = time.monotonic()
    try:
        with pytest.raises(redis.ConnectionError):
            pool.get_connection()
    finally:
        pool.release(held)
        pool.disconnect()
    assert time.monotonic() - started < 2


class _Counted(compat.CommandHook, redis.Connection):
    packed: ClassVar[list[tuple[Any, ...]]] = []

    def pack(self, args: tuple[Any, ...]) -> list[bytes] | None:
        if args[0] != "SET":
            return None
        type(self).packed.append(args)
        return [
            b"*3\r\n$3\r\nSET\r\n",
            b"$%d\r\n%s\r\n" % (len(args[1]), args[1].encode()),
            b"$2\r\nok\r\n",
        ]


def test_a_command_sent_alone_is_offered_to_the_hook_and_a_pipelines_are_not(key: str) -> None:
    _Counted.packed = []
    client = redis.Redis.from_url(TEST_REDIS_URL, connection_class=_Counted)
    try:
        client.set(key, "given")
        assert client.get(key) == b"ok"
        assert _Counted.packed == [("SET", key, "given")]
        with client.pipeline(transaction=False) as pipe:
            pipe.set(key, "piped")
            pipe.execute()
        assert client.get(key) == b"piped"
        assert len(_Counted.packed) == 1
    finally:
        client.close()


def test_every_asyncio_command_is_offered_to_the_hook(key: str) -> None:
    offered: list[tuple[Any, ...]] = []

    class Hooked(compat.AsyncCommandHook, redis.asyncio.Connection):
        def pack(self, args: tuple[Any, ...]) -> list[bytes] | None:
            offered.append(args)
            return None

    async def run() -> bytes | None:
        client = redis.asyncio.Redis.from_url(TEST_REDIS_URL, connection_class=Hooked)
        try:
            await client.set(key, "alone")
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(key, "piped")
                await pipe.execute()
            return await client.get(key)
        finally:
            await client.aclose()

    assert asyncio.run(run()) == b"piped"
    assert ("SET", key, "alone") in offered
    assert ("SET", key, "piped") in offered


def test_default_encoding_tells_redis_pys_default_from_another() -> None:
    assert compat.default_encoding(redis.Connection())
    assert compat.default_encoding(redis.asyncio.Connection())
    assert not compat.default_encoding(redis.Connection(encoding="latin-1"))
    assert not compat.default_encoding(redis.Connection(encoding_errors="replace"))


# On a Unix socket: redis-py's UnixDomainSocketConnection takes the hooks as
# its TCP connection does, and reads a unix:// URL as the broker's channels
# are told to (compat.url_options).


@pytest.fixture(scope="module")
def unix_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The socket of a private redis-server listening on it alone."""
    require(shutil.which("redis-server") is not None, "redis-server")
    server = PrivateRedis(tmp_path_factory.mktemp("unix"), unix_socket=True)
    assert server.socket is not None
    server.start()
    try:
        yield server.socket
    finally:
        server.signal(signal.SIGKILL)


def test_a_unix_socket_connection_keeps_its_timeouts_where_the_hooks_read_them() -> None:
    made = redis.UnixDomainSocketConnection(
        path="/nonexistent.sock", socket_timeout=3.0, socket_connect_timeout=2.0
    )
    assert (vars(made)["_socket_timeout"], vars(made)["_socket_connect_timeout"]) == (3.0, 2.0)
    assert made._get_socket() is None
    hooked = _UnixBound(path="/nonexistent.sock", socket_timeout=3.0)
    assert (hooked.socket_timeout, vars(hooked)["_socket_timeout"]) == (3.0, 3.0)


def test_on_a_unix_socket_an_open_connection_reads_its_timeout_through_the_hook(
    unix_socket: Path,
) -> None:
    # Not retried: each attempt would wait its own bound.
    client = redis.Redis.from_url(
        f"unix://{unix_socket}",
        connection_class=_UnixBound,
        socket_timeout=5,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        connection = client.connection_pool.get_connection()
        client.connection_pool.release(connection)
        assert isinstance(connection, _UnixBound)
        socket = connection._get_socket()
        assert socket is not None
        assert socket.gettimeout() == 5
        _UnixBound.bound = 0.1
        started = time.monotonic()
        # Without the hook's timeout armed on the open socket, this waits 2 s
        # for a list that never fills and answers None.
        with pytest.raises(redis.TimeoutError):
            client.blpop(["compat-unix-empty"], timeout=2)
        assert time.monotonic() - started < 1.5
    finally:
        _UnixBound.bound = None
        client.close()


def test_on_a_unix_socket_a_connection_made_inside_a_bound_connects_with_it(
    unix_socket: Path,
) -> None:
    _UnixBound.bound = 0.25
    connection = _UnixBound(path=str(unix_socket), socket_timeout=5)
    try:
        connection.connect()
        socket = connection._get_socket()
        assert socket is not None
        assert socket.gettimeout() == 0.25
        assert connection.socket_connect_timeout == 0.25
    finally:
        _UnixBound.bound = None
        connection.disconnect()
    assert connection.socket_timeout == 5


def test_redis_py_reads_a_unix_url_into_the_options_compat_hands_on() -> None:
    url = "unix://ds-user:p%40ss@/run/redis/redis.sock?db=3&socket_timeout=1.5"
    read = redis.connection.parse_url(url)
    assert read == {
        "username": "ds-user",
        "password": "p@ss",
        "path": "/run/redis/redis.sock",
        "db": 3,
        "socket_timeout": 1.5,
        "connection_class": redis.UnixDomainSocketConnection,
    }
    assert compat.url_options(url) == {k: v for k, v in read.items() if k != "connection_class"}
    assert compat.url_options("unix:///run/redis/redis.sock") == {"path": "/run/redis/redis.sock"}

"""Every Celery and kombu internal the service relies on, pinned: its name and
signature, and where it is cheap its behaviour on the real Redis, so that an
upgrade that changes one fails here (``dataservice/compat/``) and not in a
worker (redis-py's are pinned in ``tests/compat/test_compat_redis.py``). And the rule
that keeps them there: no module but the compat modules
(``dataservice/compat/celery.py``, ``kombu.py``, ``redis.py``) uses one.
"""

from __future__ import annotations

import ast
import inspect
import logging
import re
import shutil
import signal
import time
import types
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
import redis.sentinel
from celery import Celery
from celery.app.control import Inspect
from celery.app.task import Task
from celery.concurrency.thread import TaskPool
from celery.utils.imports import symbol_by_name
from celery.worker import state as worker_state
from celery.worker import strategy as celery_strategy
from celery.worker.consumer import Consumer as CeleryConsumer
from dataservice_tools.localservices import PrivateRedis, redis_reachable
from dataservice_tools.testkit.waits import eventually
from kombu import Connection, Consumer, Exchange, Queue
from kombu.asynchronous.timer import Timer
from kombu.message import Message
from kombu.transport import base as kombu_base
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual

from dataservice.compat import celery as celery_compat
from dataservice.compat import kombu as kombu_compat
from dataservice.compat import redis as redis_compat
from tests.conftest import TEST_REDIS_URL, require

ROOT = Path(__file__).resolve().parents[2]
COMPAT = {
    ROOT / "dataservice" / "compat" / "celery.py": celery_compat,
    ROOT / "dataservice" / "compat" / "kombu.py": kombu_compat,
    ROOT / "dataservice" / "compat" / "redis.py": redis_compat,
}
# The libraries whose internals the compat modules hold.
LIBRARIES = ("celery", "kombu", "redis")
# Underscore fields the libraries' own objects carry, which a compat module may
# set as well as read (redis-py's __init__ writes what compat/redis.py's
# properties read): used, though the module sets them.
LIBRARY_FIELDS = frozenset(
    name
    for made in (redis.Connection(), redis.BlockingConnectionPool())
    for name in vars(made)
    if name.startswith("_") and not name.startswith("__")
)
# What only the compat modules import: the rest of the project takes the
# libraries' public API (Celery, Queue, kombu.exceptions, ...) directly.
INTERNAL_MODULES = frozenset(
    {
        "celery.backends.base",
        "celery.utils.imports",
        "celery.worker.consumer",
        "celery.worker.state",
        "celery.worker.strategy",
        "kombu.transport.redis",
        "kombu.transport.virtual",
        "redis.asyncio.connection",
        "redis.connection",
    }
)
# Names in the compat docstrings that are ordinary words elsewhere (a list's
# append, a pool, the last part of a logger's name, compat's own revoked(),
# kombu's public Connection.connection_errors, asyncio.timeout): the imports of
# their modules are what is checked.
COMMON_WORDS = frozenset(
    {
        "ack",
        "append",
        "connection_errors",
        "default",
        "pool",
        "revoked",
        "sep",
        "strategy",
        "timeout",
        "trace",
    }
)
# kombu's key layout, spelled out: only compat/kombu.py does.
LAYOUT = (
    kombu_compat.PRIORITY_SEP,
    kombu_compat.BINDING_PREFIX,
    kombu_compat.PERMANENT_BINDING_PREFIX,
)


# The rule.


def listed_names(module: types.ModuleType) -> set[str]:
    """The names a compat module's docstring lists under "Internal names":
    each bullet's head, up to its colon."""
    doc = module.__doc__ or ""
    section = doc.split("Internal names, and why:", 1)[1].split("\n\n", 2)[1]
    names: set[str] = set()
    for bullet in re.split(r"^- ", section, flags=re.MULTILINE)[1:]:
        head = re.split(r":\s", bullet, maxsplit=1)[0]
        names.update(re.findall(r"``([\w.]+)``", head))
    return names


def private(names: set[str]) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name in names if name.rsplit(".", 1)[-1].startswith("_")}


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _imports(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _own_attributes(tree: ast.AST) -> set[str]:
    """Attributes a module gives its own objects: ``self.x = ...``, and class
    bodies' ``x = ...`` and methods."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    own.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else []
                if isinstance(item, ast.AnnAssign):
                    targets = [item.target]
                own.update(t.id for t in targets if isinstance(t, ast.Name))
    return own


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def uses(source: str, names: set[str]) -> list[str]:
    """Where ``source`` uses one of ``names`` (or imports an internal
    module): attributes, a class's methods and attributes, underscore
    keywords, string constants. An underscore attribute of ``self`` counts
    only when the module never sets it (then it is inherited, from the library),
    or when the library's own objects carry it too."""
    tree = ast.parse(source)
    own, docstrings = _own_attributes(tree), _docstrings(tree)
    short = {name.rsplit(".", 1)[-1] for name in names} - COMMON_WORDS
    dotted = {name for name in names if "." in name}
    found = [f"imports {module}" for module in sorted(_imports(tree) & INTERNAL_MODULES)]
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in short:
                    found.append(f"{item.lineno}: def {item.name}")
                targets = item.targets if isinstance(item, ast.Assign) else []
                if isinstance(item, ast.AnnAssign):
                    targets = [item.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in short:
                        found.append(f"{item.lineno}: {target.id} =")
        elif isinstance(node, ast.Attribute) and node.attr in short:
            mine = isinstance(node.value, ast.Name) and node.value.id == "self"
            inherited = node.attr not in own or node.attr in LIBRARY_FIELDS
            if not (mine and not inherited and node.attr.startswith("_")):
                found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in short and node.arg.startswith("_"):
            found.append(f"{line}: {node.arg}=")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (
                node.value in short
                or node.value.replace(":", ".") in dotted
                or any(part in node.value for part in LAYOUT)
            )
        ):
            found.append(f"{line}: {node.value!r}")
    return found


def test_the_rule_finds_a_private_name_and_leaves_a_modules_own_alone() -> None:
    names = {"kombu.message.Message._raw", "celery.app.control.Inspect._request"}
    assert uses("replies = inspect._request('x')", names) == ["1: ._request"]
    assert uses("record = [message._raw]", names) == ["1: ._raw"]
    assert uses("from kombu.transport import redis", names) == ["imports kombu.transport.redis"]
    assert uses('SEP = "\\x06\\x16"', names) == ["1: '\\x06\\x16'"]
    own = "class A:\n    def __init__(self):\n        self._raw = 1\n    def f(self):\n"
    assert uses(own + "        return self._raw\n", names) == []
    inherited = "class B(Base):\n    def f(self):\n        return self._raw\n"
    assert uses(inherited, names) == ["3: ._raw"]
    names = {"kombu.transport.redis.Channel.connection_class", "kombu.transport.redis.Channel._put"}
    assert uses("class C(Base):\n    connection_class = X\n", names) == ["2: connection_class ="]
    assert uses("class C(Base):\n    def _put(self): ...\n", names) == ["2: def _put"]
    # redis-py's keyword of the same name is redis-py's.
    assert uses("redis.Redis(connection_class=X)", names) == []
    # A field redis-py's connection sets itself counts, though the module sets it too.
    names = {"redis.connection.AbstractConnection._socket_timeout"}
    field = "class D(redis.Connection):\n    def f(self, v):\n        self._socket_timeout = v\n"
    assert uses(field, names) == ["3: ._socket_timeout"]


def test_every_compat_module_lists_each_private_name_it_uses() -> None:
    """The docstrings are the list the rule enforces: each underscore name
    listed is used there, and each library underscore name used is listed."""
    for path, module in COMPAT.items():
        listed = private(listed_names(module))
        tree = ast.parse(path.read_text())
        own = _own_attributes(tree)
        used: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                if not _is_dunder(node.attr) and (
                    node.attr not in own or node.attr in LIBRARY_FIELDS
                ):
                    used.add(node.attr)
            elif isinstance(node, ast.Constant) and re.fullmatch(r"_[a-z]\w*", str(node.value)):
                used.add(str(node.value))
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != module.__name__:
                continue
            library = [base for base in cls.__mro__[1:] if base.__module__.startswith(LIBRARIES)]
            overrides = {
                name
                for name in vars(cls)
                if name.startswith("_")
                and not _is_dunder(name)
                # ABCMeta's, on every subclass of an abstract class.
                and name != "_abc_impl"
                and any(hasattr(base, name) for base in library)
            }
            used |= overrides
        assert used == listed, f"{path.name}: used {sorted(used)}, listed {sorted(listed)}"


def test_no_module_but_the_compat_modules_uses_a_library_internal() -> None:
    names = set().union(*(listed_names(module) for module in COMPAT.values()))
    assert private(names) >= {"_put", "_q_for_pri", "_raw", "_request", "_state", "_get_socket"}
    offences = {}
    for path in sorted([*(ROOT / "dataservice").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]):
        if path in COMPAT or path.name.endswith("_pb2.py"):
            continue
        found = uses(path.read_text(), names)
        if found:
            offences[str(path.relative_to(ROOT))] = found
    assert offences == {}


# kombu: its Redis channel and the layout of its keys, on the real Redis.


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    require(redis_reachable(TEST_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(TEST_REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def name(broker: redis.Redis) -> Iterator[str]:
    """A queue of the test's own (its unacked keys too): deleted afterwards."""
    own = f"compat-{uuid.uuid4().hex[:12]}"
    yield own
    keys = list(broker.scan_iter(f"*{own}*"))
    if keys:
        broker.delete(*keys)


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def _own_unacked(name: str) -> dict[str, str]:
    return {"unacked_key": f"{name}:unacked", "unacked_index_key": f"{name}:unacked_index"}


def _deliver_one(conn: Connection, name: str, then: Callable[[Message], None]) -> Message:
    """Publish one message to ``name`` and have a consumer receive it, leaving
    it unacknowledged; ``then`` runs while the consumer holds it."""
    with conn.Producer() as producer:
        producer.publish({"n": 1}, exchange=name, routing_key=name, declare=[_queue(name)])
    got: list[Message] = []
    with Consumer(
        conn, queues=[_queue(name)], callbacks=[lambda _, m: got.append(m)], prefetch_count=1
    ):
        conn.drain_events(timeout=5)
        then(got[0])
    return got[0]


def test_kombu_private_names_keep_their_signatures() -> None:
    channel, qos = kombu_redis.Channel, kombu_redis.QoS

    def params(function: Callable[..., Any]) -> list[str]:
        return list(inspect.signature(function).parameters)

    assert params(channel._put) == ["self", "queue", "message", "kwargs"]
    assert "_publish_batch" in inspect.getsource(channel._put)
    assert isinstance(inspect.getattr_static(channel, "supports_batch_publish"), property)
    assert params(channel._connparams) == ["self", "asynchronous"]
    assert params(channel._get_client) == ["self"]
    assert params(channel._create_client) == ["self", "asynchronous"]
    assert "self.Client = self._get_client()" in inspect.getsource(channel.__init__)
    assert channel._pool is None
    assert params(channel.conn_or_acquire) == ["self", "client"]
    assert params(channel._q_for_pri) == ["self", "queue", "pri"]
    assert params(channel._get_message_priority) == ["self", "message", "reverse"]
    assert (channel.connection_class, channel.connection_class_ssl) == (
        redis.Connection,
        redis.SSLConnection,
    )
    assert channel.QoS is qos
    assert kombu_redis.Transport.Channel is channel
    assert params(qos.append) == ["self", "message", "delivery_tag"]
    assert params(kombu_virtual.QoS.append) == ["self", "message", "delivery_tag"]
    assert params(kombu_virtual.QoS.ack) == ["self", "delivery_tag"]
    assert {"unacked_key", "unacked_index_key"} <= set(vars(qos))
    assert "self._raw = payload" in inspect.getsource(kombu_virtual.base.Message.__init__)
    assert "self._state = 'ACK'" in inspect.getsource(Message.ack)
    assert (
        channel.sep,
        channel.keyprefix_queue % "",
        channel.keyprefix_binding_permanent % "",
    ) == (
        kombu_compat.PRIORITY_SEP,
        kombu_compat.BINDING_PREFIX,
        kombu_compat.PERMANENT_BINDING_PREFIX,
    )


def test_kombus_sentinel_channel_is_what_compat_puts_beneath_the_hooks() -> None:
    sentinel = kombu_redis.SentinelChannel
    assert issubclass(sentinel, kombu_redis.Channel)
    assert {"master_name", "sentinel_kwargs"} <= set(sentinel.from_transport_options)
    assert list(inspect.signature(sentinel._get_pool).parameters) == ["self", "asynchronous"]
    assert "self._sentinel_managed_pool(asynchronous)" in inspect.getsource(sentinel._get_pool)
    managed = inspect.signature(sentinel._sentinel_managed_pool).parameters
    assert list(managed) == ["self", "asynchronous"]
    # kombu's disconnect closes the Sentinel clients the pool is made with.
    closes = inspect.getsource(kombu_redis.Channel._disconnect_pools)
    assert "_sentinel_manager" in closes
    assert "_async_sentinel_manager" in closes
    # The hooks come first, kombu's Sentinel pool beneath them.
    mro = kombu_compat.RedisSentinelChannel.__mro__
    assert mro.index(kombu_compat.RedisChannel) < mro.index(sentinel)
    assert kombu_compat.RedisSentinelChannel.connection_class is (
        redis.sentinel.SentinelManagedConnection
    )


@pytest.mark.parametrize(("priority", "suffix"), [(None, ""), (5, f"{kombu_compat.PRIORITY_SEP}3")])
def test_kombu_pushes_a_message_where_and_as_compat_says(
    broker: redis.Redis, name: str, priority: int | None, suffix: str
) -> None:
    with Connection(TEST_REDIS_URL, transport=kombu_compat.RedisTransport) as conn:
        channel = conn.default_channel
        _queue(name)(channel).declare()
        message = channel.prepare_message("body", priority=priority, content_type="text/plain")
        channel.basic_publish(message, exchange=name, routing_key=name)
        key = channel.queue_key(name, message)
    assert key == name + suffix
    assert broker.lrange(key, 0, -1) == [kombu_compat.queue_entry(message).encode()]
    assert broker.exists(kombu_compat.BINDING_PREFIX + name)
    assert broker.exists(kombu_compat.PERMANENT_BINDING_PREFIX + name)


def test_kombus_own_record_of_a_delivery_is_where_and_what_compat_says(
    broker: redis.Redis, name: str
) -> None:
    seen: dict[str, Any] = {}

    def look(message: Message) -> None:
        seen["keys"] = kombu_compat.unacked_keys(message)
        seen["record"] = broker.hget(f"{name}:unacked", message.delivery_tag)
        seen["since"] = broker.zscore(f"{name}:unacked_index", message.delivery_tag)
        seen["expected"] = kombu_compat.unacked_record(message).encode()
        # Acknowledged the way answer.lua does it, then settled in kombu's books.
        broker.zrem(f"{name}:unacked_index", message.delivery_tag)
        broker.hdel(f"{name}:unacked", message.delivery_tag)
        seen["could_consume"] = message.channel.qos.can_consume()
        kombu_compat.settle_acknowledged(message)
        seen["can_consume"] = message.channel.qos.can_consume()

    with Connection(TEST_REDIS_URL, transport_options=_own_unacked(name)) as conn:
        message = _deliver_one(conn, name, look)
    assert seen["keys"] == (f"{name}:unacked_index", f"{name}:unacked")
    assert seen["record"] == seen["expected"]
    assert time.time() - 5 < seen["since"] <= time.time()
    assert (seen["could_consume"], seen["can_consume"]) == (False, True)
    assert message.acknowledged
    # Nothing left to restore: the broker holds no copy of the message.
    assert broker.llen(name) == 0


class _DeferringChannel(kombu_compat.RedisChannel):
    def defers_record(self, message: Any) -> bool:
        return True


class _DeferringTransport(kombu_compat.RedisTransport):
    Channel = _DeferringChannel


def test_compat_records_a_delivery_as_kombu_does_and_a_deferred_one_when_told(
    broker: redis.Redis, name: str
) -> None:
    records: list[Any] = []

    def look(message: Message) -> None:
        records.append(broker.hget(f"{name}:unacked", message.delivery_tag))
        kombu_compat.write_deferred(message)
        records.append(broker.hget(f"{name}:unacked", message.delivery_tag))
        records.append(kombu_compat.unacked_record(message).encode())
        message.ack()

    options = _own_unacked(name)
    with Connection(
        TEST_REDIS_URL, transport=kombu_compat.RedisTransport, transport_options=options
    ) as conn:
        _deliver_one(conn, name, look)
    with Connection(
        TEST_REDIS_URL, transport=_DeferringTransport, transport_options=options
    ) as conn:
        _deliver_one(conn, name, look)
    written, _, expected = records[:3]
    assert written == expected
    deferred, flushed, expected = records[3:]
    assert (deferred, flushed) == (None, expected)


def test_a_redis_channels_hooks_reach_kombus_pool_and_clients(broker: redis.Redis) -> None:
    made: list[dict[str, Any]] = []

    class Counted(redis.Connection):
        pass

    def factory(**kwargs: Any) -> redis.Redis:
        made.append(kwargs)
        return redis.Redis(**kwargs)

    class Hooked(kombu_compat.RedisChannel):
        redis_connection_class = Counted
        redis_options: ClassVar[Mapping[str, Any]] = {"client_name": "compat-hooks"}

        def client_factory(self) -> Any:
            return factory

        def push(self, queue: str, message: dict[str, Any]) -> bool:
            pushed.append(queue)
            return True

    class HookedTransport(kombu_compat.RedisTransport):
        Channel = Hooked

    pushed: list[str] = []
    with Connection(TEST_REDIS_URL, transport=HookedTransport) as conn:
        channel = conn.default_channel
        assert channel.pool.connection_class is Counted
        assert channel.pool.connection_kwargs["client_name"] == "compat-hooks"
        assert channel.redis_client() is channel.redis_client()
        assert channel.redis_client().connection_pool is channel.pool
        with channel.conn_or_acquire() as client:
            assert client is channel.redis_client()
        channel.basic_publish(
            channel.prepare_message("x"), exchange="", routing_key="compat-pushed"
        )
    assert made
    assert pushed == ["compat-pushed"]
    assert not broker.exists("compat-pushed")


# kombu on a Unix socket: the URL kept whole, read as redis-py reads it.


@pytest.fixture(scope="module")
def unix_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private redis-server on a Unix socket alone: its URL, database 2."""
    require(shutil.which("redis-server") is not None, "redis-server")
    server = PrivateRedis(tmp_path_factory.mktemp("unix"), unix_socket=True)
    server.start()
    try:
        yield server.url_of(2)
    finally:
        server.signal(signal.SIGKILL)


def test_kombu_keeps_a_unix_url_whole_for_the_unix_transport_alone() -> None:
    url = "unix:///run/redis/redis.sock?db=2"
    assert inspect.getattr_static(kombu_base.Transport, "can_parse_url") is False
    assert kombu_compat.RedisUnixTransport.can_parse_url is True
    kept = Connection(url, transport=kombu_compat.RedisUnixTransport)
    assert (kept.hostname, kept.transport_cls) == (url, kombu_compat.RedisUnixTransport)
    # Read by kombu, the socket's path would be its database, and a db refused.
    read = Connection("unix:///run/redis/redis.sock", transport=kombu_compat.RedisTransport)
    assert (read.hostname, read.virtual_host) == (None, "run/redis/redis.sock")
    with pytest.raises(TypeError, match="'db'"):
        Connection(url, transport=kombu_compat.RedisTransport)
    # kombu's own Unix-socket form takes its stock transport, whatever is asked for.
    stock = Connection("redis+socket:///run/redis/redis.sock", transport=_DeferringTransport)
    assert stock.transport_cls == "redis"


def test_a_unix_channels_pool_is_of_its_class_on_the_urls_socket_and_database(
    unix_url: str,
) -> None:
    class Counted(redis.UnixDomainSocketConnection):
        pass

    class Hooked(kombu_compat.RedisUnixChannel):
        redis_connection_class = Counted

    class HookedTransport(kombu_compat.RedisUnixTransport):
        Channel = Hooked

    name = f"compat-unix-{uuid.uuid4().hex[:12]}"
    options = {"socket_keepalive": True, "socket_connect_timeout": 2.0}
    with Connection(unix_url, transport=HookedTransport, transport_options=options) as conn:
        channel = conn.default_channel
        assert channel.pool.connection_class is Counted
        kwargs = channel.pool.connection_kwargs
        assert (kwargs["path"], kwargs["db"]) == (redis.connection.parse_url(unix_url)["path"], 2)
        assert kwargs["socket_connect_timeout"] == 2.0
        assert "socket_keepalive" not in kwargs
        assert "host" not in kwargs
        message = _deliver_one(conn, name, lambda message: message.ack())
    assert message.acknowledged
    with redis.Redis.from_url(unix_url) as server:
        assert server.exists(kombu_compat.BINDING_PREFIX + name)
        server.delete(kombu_compat.BINDING_PREFIX + name)


# Celery: the worker's strategies, state and consumer, and the control channel.


@pytest.fixture
def consumer() -> Iterator[Any]:
    """A worker's consumer as Celery builds it, not started (its control step
    reads only this of the worker's controller)."""
    app = Celery("compat-tests", set_as_current=False)
    app.conf.broker_url = TEST_REDIS_URL
    app.conf.broker_connection_retry_on_startup = True

    @app.task(name="compat.probe", shared=False)
    def probe() -> None:
        pass

    pool, timer = TaskPool(limit=1), Timer()
    controller = types.SimpleNamespace(use_eventloop=False, state=worker_state)

    class Paced(celery_compat.PacedConsumer):
        reconnect_intervals = (0.1, 0.2, 1.0)

    built = Paced(
        lambda _: None,
        app=app,
        pool=pool,
        hostname="compat@tests",
        timer=timer,
        controller=controller,
    )
    pool.start()
    yield built
    pool.stop()
    timer.stop()
    built.conninfo.release()
    app.close()


def _probe_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Any:
    return ("probe", task.name)


def test_a_tasks_strategy_is_what_the_worker_builds_its_handler_with(consumer: Any) -> None:
    task = consumer.app.tasks["compat.probe"]
    assert Task.Strategy == celery_compat.DEFAULT_STRATEGY
    celery_compat.use_strategy(task, f"{__name__}:_probe_strategy")
    assert task.start_strategy(consumer.app, consumer) == ("probe", "compat.probe")


def test_the_default_strategys_handler_takes_what_the_fast_path_passes_on(consumer: Any) -> None:
    task = consumer.app.tasks["compat.probe"]
    handler = celery_compat.default_strategy(task, consumer.app, consumer)
    parameters = list(inspect.signature(handler).parameters)
    assert parameters[:5] == ["message", "body", "ack", "reject", "callbacks"]
    assert symbol_by_name(celery_compat.DEFAULT_STRATEGY) is celery_strategy.default
    assert list(inspect.signature(Message.ack_log_error).parameters)[:3] == [
        "self",
        "logger",
        "errors",
    ]
    # The fast path drops a message no one may read with the ``reject`` it is passed.
    assert list(inspect.signature(Message.reject_log_error).parameters)[:4] == [
        "self",
        "logger",
        "errors",
        "requeue",
    ]


def test_what_a_strategy_uses_of_the_consumer(consumer: Any) -> None:
    used = celery_compat.StrategyConsumer(consumer)
    assert redis.ConnectionError in used.connection_errors
    assert used.events is None
    assert not used.rate_limited("compat.probe")
    consumer.task_buckets["compat.probe"] = object()
    assert used.rate_limited("compat.probe")
    consumer.disable_rate_limits = True
    assert not used.rate_limited("compat.probe")
    ran: list[int] = []
    used.soon(ran.append, 1)
    consumer.perform_pending_operations()
    used.in_pool(lambda: ran.append(2))
    eventually(lambda: len(ran) >= 2, timeout=5)
    assert ran == [1, 2]
    acked: list[Any] = []
    used.acknowledge(lambda logger, errors: acked.append((logger, errors)), logging.getLogger("t"))
    assert acked == [(logging.getLogger("t"), used.connection_errors)]


def test_the_paced_consumer_paces_celerys_connection_attempts(consumer: Any) -> None:
    class Conn:
        def __init__(self) -> None:
            self.options: dict[str, Any] = {}

        def ensure_connection(self, *args: Any, **options: Any) -> Conn:
            self.options = options
            return self

    conn = Conn()
    assert inspect.signature(CeleryConsumer.ensure_connected).parameters.keys() == {"self", "conn"}
    assert consumer.ensure_connected(conn) is conn
    assert {k: conn.options[k] for k in ("interval_start", "interval_step", "interval_max")} == {
        "interval_start": 0.1,
        "interval_step": 0.2,
        "interval_max": 1.0,
    }
    assert "ensure_connection" not in vars(conn)


def test_the_consumer_leaves_out_celerys_native_delayed_delivery() -> None:
    celerys = CeleryConsumer.Blueprint.default_steps
    ours = celery_compat.PacedConsumer.Blueprint.default_steps
    assert celery_compat.DELAYED_DELIVERY_STEP in celerys
    assert ours == [step for step in celerys if step != celery_compat.DELAYED_DELIVERY_STEP]
    assert symbol_by_name(celery_compat.DELAYED_DELIVERY_STEP).__name__ == "DelayedDelivery"


def test_the_workers_state_counts_and_drops_as_compat_says() -> None:
    task_id, name = uuid.uuid4().hex, f"compat.{uuid.uuid4().hex[:8]}"
    total = worker_state.all_total_count[0]
    celery_compat.count_processed(name)
    assert (worker_state.total_count[name], worker_state.all_total_count[0]) == (1, total + 1)
    del worker_state.total_count[name]
    worker_state.all_total_count[0] = total
    assert not celery_compat.revoked(task_id, stamped=True)
    worker_state.revoked.add(task_id)
    try:
        assert celery_compat.revoked(task_id, stamped=False)
    finally:
        worker_state.revoked.discard(task_id)
    worker_state.revoked_stamps["compat"] = ["x"]
    try:
        assert celery_compat.revoked(task_id, stamped=True)
        assert not celery_compat.revoked(task_id, stamped=False)
    finally:
        del worker_state.revoked_stamps["compat"]


def test_an_app_without_a_result_backend_stores_no_results() -> None:
    apps = [Celery(f"compat-results-{n}", set_as_current=False) for n in range(2)]
    apps[0].conf.result_backend = None
    apps[1].conf.result_backend = "cache+memory://"
    assert [celery_compat.stores_results(app) for app in apps] == [False, True]
    for app in apps:
        app.close()


def test_celerys_per_task_loggers_are_the_ones_compat_quiets() -> None:
    from celery.app import trace

    assert {celery_strategy.logger.name, trace.logger.name} == set(celery_compat.PER_TASK_LOGGERS)


def test_a_control_request_nobody_answers_is_none(broker: redis.Redis) -> None:
    assert list(inspect.signature(Inspect._request).parameters) == ["self", "command", "kwargs"]
    app = Celery("compat-control", set_as_current=False)
    app.conf.broker_url = TEST_REDIS_URL
    try:
        ask = app.control.inspect(timeout=0.1, destination=[f"nobody-{uuid.uuid4().hex}@tests"])
        assert celery_compat.broadcast_request(ask, "ping") is None
    finally:
        app.close()

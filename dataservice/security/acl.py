"""Redis users (ACL): what a caller's connections may touch, and the workers'.

Callers reach Redis for two things only, publishing a request and taking its
answer, so each caller gets a user of its own (``ds-caller-<caller>``) whose
rules allow exactly the commands those need, on exactly the keys they need
(Redis 7 selectors, one per purpose):

=========================================  ==================  =========================
keys                                       commands            needed by
=========================================  ==================  =========================
(none)                                     PING SELECT         the connection
(none)                                     MULTI EXEC          kombu's queue declaration
(none)                                     TIME                ``admit.lua``
lane queues, admission hashes and held     EVALSHA EVAL        admission
sets, ``ds:epoch`` and the caller's own
``ds:pace:<caller>`` (RW)
``ds:pace:<caller>`` (its own)             GET SET             ``admit.lua``'s pacing
``ds:epoch``                               GET SET             ``admit.lua``; a handle's
                                                               check for a lost request
lane queues (write only)                   LPUSH LLEN          ``admit.lua``, declaration
kombu's priority sub-queues (write only)   LLEN                declaration
admission hashes                           HMGET HSET HINCRBY  ``admit.lua``
                                           PEXPIRE
held sets (``ds:admission:<queue>:held``)  ZADD ZREM ZCARD     ``admit.lua``
                                           ZRANGE
                                           ZRANGEBYSCORE
                                           PEXPIRE
kombu's binding tables (write only)        SADD                declaration
``ds:result:<caller>:*``                   BLPOP LPOP EXISTS   the result store
=========================================  ==================  =========================

Redis checks a script's commands against the user that runs it, and checks
the keys an ``EVAL`` names for both read and write; the queue is therefore
readable only in the selector that grants nothing but ``EVALSHA``/``EVAL``,
and every command that could return a message (``LRANGE``, ``LPOP``, ...)
is refused, inside a script or not. No channels: callers never subscribe.

The workers' user (``ds-worker``) may touch every key and channel and run
everything except ``@dangerous`` (``KEYS``, ``FLUSHDB``, ``CONFIG``,
``ACL SETUSER``, ...): the replay, rate and in-flight keys, the cache and its locks
are theirs alone because no caller's pattern matches them.

Users are created by an administrator's connection (``ACL SETUSER ... reset``,
so applying again replaces every rule and password). Redis keeps ACL users per
server and does not replicate them: apply them to every node (given a
``sentinel://`` URL, :func:`apply_everywhere` does, to the primary and every
replica the Sentinels know of, and names each it could not reach).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ServiceSetupError
from dataservice.redis import endpoints
from dataservice.redis.keys import (
    CONF_KEY,
    EPOCH_KEY,
    PACING_CONF_KEY,
    admission_key,
    binding_key,
    held_key,
    pace_key,
    permanent_binding_key,
    priority_queue_pattern,
    reply_pattern,
    result_pattern,
)
from dataservice.security.callers import KeyRing, Secret, load_keyring

CALLER_USER_PREFIX = "ds-caller-"
WORKER_USER = "ds-worker"
PASSWORD_PLACEHOLDER = "<password>"

# Keyless commands: the connection's own (redis-py sends HELLO, which needs no
# permission, then SELECT; health checks PING), the transaction kombu wraps
# its queue declaration in, the clock admit.lua reads, and the publish
# interface (it declares no keys: its commands are checked one by one).
_CALLER_KEYLESS = ("+ping", "+select", "+multi", "+exec", "+time", "+fcall")
_WORKER_RULES = ("~*", "&*", "+@all", "-@dangerous")


def caller_user(caller: str) -> str:
    return CALLER_USER_PREFIX + caller


def lane_queues(config: Config) -> tuple[str, ...]:
    return tuple(config.lanes[lane].queue for lane in LaneName)


def _selector(patterns: Sequence[str], commands: Sequence[str]) -> str:
    return "(" + " ".join([*patterns, *commands]) + ")"


def caller_rules(queues: Sequence[str], caller: str) -> list[str]:
    """The rules (after ``reset on >password``) of one caller's user."""
    return [
        *_CALLER_KEYLESS,
        _selector(
            [f"%RW~{k}" for q in queues for k in (q, admission_key(q), held_key(q))]
            + [f"%RW~{pace_key(caller)}", f"%RW~{EPOCH_KEY}"],
            ["+evalsha", "+eval"],
        ),
        # What the publish interface reads of the workers' configuration.
        _selector([f"%R~{CONF_KEY}", f"%R~{PACING_CONF_KEY}"], ["+hmget", "+hget"]),
        # admit.lua's publish pacing, on the caller's own key.
        _selector([f"%RW~{pace_key(caller)}"], ["+get", "+set"]),
        # admit.lua sets the epoch in a Redis that has none; a handle reads it.
        _selector([f"%RW~{EPOCH_KEY}"], ["+get", "+set"]),
        _selector([f"%W~{q}" for q in queues], ["+lpush", "+llen"]),
        _selector([f"%W~{priority_queue_pattern(q)}" for q in queues], ["+llen"]),
        _selector(
            [f"%RW~{admission_key(q)}" for q in queues], ["+hmget", "+hset", "+hincrby", "+pexpire"]
        ),
        _selector(
            [f"%RW~{held_key(q)}" for q in queues],
            ["+zadd", "+zrem", "+zcard", "+zrange", "+zrangebyscore", "+pexpire"],
        ),
        _selector(
            [f"%W~{k}" for q in queues for k in (binding_key(q), permanent_binding_key(q))],
            ["+sadd"],
        ),
        _selector([f"%RW~{result_pattern(caller)}"], ["+blpop", "+lpop", "+exists"]),
        # Its own reply channels: the answers to the requests that name one.
        _selector([f"%RW~{reply_pattern(caller)}"], ["+blmpop", "+blpop", "+lpop", "+llen"]),
    ]


def worker_rules() -> list[str]:
    """The rules (after ``reset on >password``) of the workers' user."""
    return list(_WORKER_RULES)


@dataclass(frozen=True, slots=True)
class AclUser:
    name: str
    rules: tuple[str, ...]
    password: Secret = field(repr=False)


def acl_users(keyring: KeyRing, config: Config) -> list[AclUser]:
    """Every user the callers file gives a password: callers by name, then the workers."""
    queues = lane_queues(config)
    users = [
        AclUser(caller_user(caller), tuple(caller_rules(queues, caller)), password)
        for caller, password in sorted(keyring.redis_passwords.items())
    ]
    if keyring.workers_redis_password is not None:
        users.append(AclUser(WORKER_USER, tuple(worker_rules()), keyring.workers_redis_password))
    return users


def apply_acl(admin: redis.Redis, keyring: KeyRing, config: Config) -> list[str]:
    """Create or replace the users on ``admin``'s server; returns their names."""
    names = []
    for user in acl_users(keyring, config):
        try:
            admin.execute_command(  # type: ignore[no-untyped-call]
                "ACL", "SETUSER", user.name, "reset", "on", b">" + user.password.value, *user.rules
            )
        except redis.RedisError as exc:
            # The server quotes a modifier it refuses; make sure it is never the password.
            detail = str(exc).replace(user.password.value.decode(), PASSWORD_PLACEHOLDER)
            raise ServiceSetupError(f"cannot set Redis user {user.name}: {detail}") from None
        names.append(user.name)
    return names


def admin_client(url: str) -> redis.Redis:
    return endpoints.client(url, socket_connect_timeout=2, socket_timeout=5)


@dataclass(frozen=True)
class AdminServer:
    """One server to set the users on: where it is, for an operator, and an
    administrator's client of it."""

    where: str
    client: redis.Redis = field(repr=False)


def admin_servers(url: str) -> list[AdminServer]:
    """Each server at ``url``: the one server, or a Sentinel-managed primary
    and every replica the Sentinels know of, those they call down included
    (ACL users are not replicated, and a replica promoted later must have
    them)."""
    if not endpoints.is_sentinel(url):
        return [AdminServer(endpoints.where(url), admin_client(url))]
    target = endpoints.SentinelTarget.parse(url)
    sentinels = target.manager({})
    try:
        primary = sentinels.discover_master(target.primary)
        replicas = _replicas(sentinels, target.primary)
    except redis.RedisError as exc:
        raise ServiceSetupError(
            f"the servers of {target.where()} are unknown: {type(exc).__name__}"
        ) from None
    finally:
        for sentinel in sentinels.sentinels:
            sentinel.close()
    return [
        AdminServer(
            f"{host}:{port} ({role})",
            redis.Redis(
                host=host,
                port=port,
                **target.primary_options(),
                socket_connect_timeout=2,
                socket_timeout=5,
            ),
        )
        for (host, port), role in [(primary, "primary"), *((r, "replica") for r in replicas)]
    ]


def _replicas(sentinels: redis.sentinel.Sentinel, primary: str) -> list[tuple[str, int]]:
    """Every replica the first Sentinel that answers knows of, down or not
    (redis-py's ``discover_slaves`` leaves out those it calls down)."""
    failed: redis.RedisError | None = None
    for sentinel in sentinels.sentinels:
        try:
            known = sentinel.sentinel_slaves(primary)
        except redis.RedisError as exc:
            failed = exc
            continue
        return [(str(r["ip"]), int(r["port"])) for r in known]
    raise failed or redis.ConnectionError("no Sentinel answered")


def apply_everywhere(url: str, keyring: KeyRing, config: Config) -> list[str]:
    """Set the users on every server at ``url`` that answers; their names.
    Raises :class:`ServiceSetupError` naming each server that did not (once
    the others have them)."""
    names: list[str] = []
    missed: list[str] = []
    for server in admin_servers(url):
        try:
            names = apply_acl(server.client, keyring, config)
        except ServiceSetupError as exc:
            missed.append(f"{server.where}: {exc}")
        except redis.RedisError as exc:
            missed.append(f"{server.where}: {type(exc).__name__}")
        finally:
            server.client.close()
    if missed:
        raise ServiceSetupError(
            "Redis users not set on " + "; ".join(missed) + ": apply them again once it answers"
        )
    return names


def apply_from_settings(settings: Settings) -> list[str]:
    """Apply the callers file's users on ``settings.redis_url`` (an administrator:
    on every server of a Sentinel-managed group); nothing when no callers file
    is configured."""
    if settings.callers_file is None:
        return []
    return apply_everywhere(
        settings.redis_url, load_keyring(settings.callers_file), settings.load()
    )


_BARE = frozenset(string.ascii_letters + string.digits + "!#$%&()*+,-./:;<=>?@[]^_`{|}~")


def _quote(arg: str) -> str:
    """``arg`` as redis-cli reads it (its own quoting, not a shell's)."""
    if arg and all(c in _BARE for c in arg):
        return arg
    escaped = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return (
        '"'
        + "".join(escaped.get(c) or (c if c.isprintable() else f"\\x{ord(c):02x}") for c in arg)
        + '"'
    )


def render_commands(keyring: KeyRing, config: Config) -> list[str]:
    """The ``ACL SETUSER`` commands :func:`apply_acl` runs, one per line for
    ``redis-cli``, each password replaced by ``<password>``."""
    head = ("ACL", "SETUSER")
    return [
        " ".join(
            _quote(arg)
            for arg in (*head, user.name, "reset", "on", f">{PASSWORD_PLACEHOLDER}", *user.rules)
        )
        for user in acl_users(keyring, config)
    ]

"""The publish interface on Redis: a function library (``publish.lua``) that
any caller calls with the protocol's own terms (docs/protocol.md,
"Publishing on Redis"), and the configuration it reads.

The workers install both when they start (:func:`install`) and again when
they find them gone (:func:`ensure`: a Redis that restarted empty): the
library with ``FUNCTION LOAD REPLACE`` (functions are the server's, shared by
its databases; Redis replicates them and keeps them on disk), the lanes'
bounds and the callers' rates in the database's ``ds:conf`` hashes, from the
workers' ``queues.yml``. A client asks nothing of the configuration itself;
one that finds nothing installed installs it from its own configuration when
its Redis user may (no ACL user: a test, a Redis of one's own), and is told
:class:`~dataservice.errors.Unavailable` otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
from collections.abc import Sequence
from typing import Any, Final

import redis
from redis.asyncio import Redis as AsyncRedis

from dataservice.codec.requests import MESSAGE_OPERATIONS
from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.errors import Unavailable
from dataservice.limits.admission import books_expiry_ms, lane_admission_bounds
from dataservice.redis.keys import CONF_KEY, PACING_CONF_KEY
from dataservice.redis.scripts import compose

log = logging.getLogger(__name__)

LIBRARY_NAME: Final = "dataservice_v2"
PUBLISH: Final = "ds_publish_v2"
TEXT: Final = compose("publish.lua", __package__)
# What ds:conf says of the library that wrote it.
VERSION: Final = "3"
# How long a refused publish waits before the next, while nothing is installed.
RETRY_UNCONFIGURED_S = 0.5
# The error replies of a Redis without the library, of a database without the
# configuration, and of a library older than the configuration (workers of two
# versions on one server) (redis-py drops the "ERR " before each).
_NOT_INSTALLED = (
    "Function not found",
    "dataservice: not configured",
    "dataservice: ds:conf holds a lane of another version",
)


def not_installed(error: object) -> bool:
    """Whether ``error`` says the library or the configuration is missing."""
    return isinstance(error, redis.ResponseError) and str(error).startswith(_NOT_INSTALLED)


def unconfigured() -> Unavailable:
    return Unavailable(
        "the broker's Redis has no dataservice configuration: no worker has started on it",
        retry_after=RETRY_UNCONFIGURED_S,
    )


def lane_entry(config: Config, lane: LaneName) -> str:
    """A lane's ``ds:conf`` entry: its queue and bounds, tab-separated in the
    order ``publish.lua`` reads them (``LANE_FIELDS``)."""
    lane_config = config.lanes[lane]
    bounds = lane_admission_bounds(config)[lane_config.queue]
    fields = (
        lane_config.queue,
        bounds.max_messages,
        bounds.max_bytes,
        bounds.default_deadline_ms,
        books_expiry_ms(bounds),
        bounds.target_wait_ms,
        bounds.stats_key,
        bounds.held_key,
        lane_config.max_ops_per_message,
        pacing_digest(config),
    )
    return "\t".join(str(field) for field in fields)


def pacing_digest(config: Config) -> str:
    """A digest of ``ds:conf:pacing`` as :func:`pacing_fields` writes it, in
    each lane's entry: ``publish.lua`` keeps the callers' rates it read under
    the digest, and an entry admission confirms says they still hold."""
    text = "\n".join(f"{caller}={rate}" for caller, rate in sorted(pacing_fields(config).items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def conf_fields(config: Config) -> dict[str, str]:
    """Everything ``ds:conf`` holds."""
    fields = {f"lane:{lane.value}": lane_entry(config, lane) for lane in LaneName}
    fields["version"] = VERSION
    return fields


def pacing_fields(config: Config) -> dict[str, str]:
    """``ds:conf:pacing``: each caller's emission interval (µs), burst and lease."""
    from dataservice.limits.pacing import lease_size

    return {
        caller: f"{policy.rate.interval_us}\t{policy.rate.burst}\t{lease_size(policy.rate.burst)}"
        for caller, policy in config.callers.items()
    }


def install(client: redis.Redis, config: Config) -> None:
    """Load the library (replacing any) and write the configuration, in one
    transaction for the configuration: a publish sees all of it or none."""
    client.function_load(TEXT, replace=True)
    with client.pipeline(transaction=True) as pipe:
        for command in _writes(config):
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        pipe.execute()


def ensure(client: redis.Redis, config: Config) -> bool:
    """Install both unless the configuration is there; whether it installed."""
    if client.exists(CONF_KEY):
        return False
    install(client, config)
    return True


async def install_async(client: AsyncRedis, config: Config) -> None:
    """:func:`install`, on an asyncio client."""
    await client.function_load(TEXT, replace=True)
    async with client.pipeline(transaction=True) as pipe:
        for command in _writes(config):
            pipe.execute_command(*command)
        await pipe.execute()


def _writes(config: Config) -> list[list[str]]:
    """The commands that write the configuration afresh."""
    writes = [["DEL", CONF_KEY, PACING_CONF_KEY]]
    # Each lane's books say which entry they were kept under (admit.lua's
    # `conf` field): cleared, the next publish reads the new one.
    writes += [["HDEL", lane.stats_key, "conf"] for lane in lane_admission_bounds(config).values()]
    for key, fields in ((CONF_KEY, conf_fields(config)), (PACING_CONF_KEY, pacing_fields(config))):
        if fields:
            writes.append(["HSET", key, *(part for pair in fields.items() for part in pair)])
    return writes


def publish_args(
    lane: LaneName,
    request_id: str,
    caller: str,
    deadline_ms: int,
    operation: str,
    ops: int,
    body: bytes,
    pacing: int = 0,
) -> list[Any]:
    """``FCALL ds_publish_v2``'s command, after its name (no keys)."""
    return [
        PUBLISH,
        0,
        lane.value,
        request_id,
        caller,
        deadline_ms,
        operation if operation in MESSAGE_OPERATIONS else "",
        ops,
        base64.b64encode(body),
        pacing,
    ]


def publish(client: redis.Redis, args: Sequence[Any], config: Config) -> Any:
    """Run ``FCALL`` with ``args`` (:func:`publish_args`); the answer. A
    missing library or configuration is installed from ``config`` once, when
    ``client``'s user may; else :func:`unconfigured` is raised."""
    try:
        return client.execute_command("FCALL", *args)  # type: ignore[no-untyped-call]
    except redis.ResponseError as exc:
        if not not_installed(exc):
            raise
    try:
        install(client, config)
    except redis.ResponseError:
        raise unconfigured() from None
    return client.execute_command("FCALL", *args)  # type: ignore[no-untyped-call]


class LibraryKeeper:
    """A worker's side: :func:`install` at start, then :func:`ensure` every
    ``CHECK_EVERY_S`` on a thread of its own (a Redis that restarted empty
    is configured again within a beat), until stopped; ``client`` stays its
    owner's. A Redis that does not answer is asked again next beat."""

    CHECK_EVERY_S = 1.0

    def __init__(self, client: redis.Redis, config: Config) -> None:
        self._client = client
        self._config = config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="library-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            install(self._client, self._config)
        except redis.RedisError as exc:
            log.warning("the publish interface is not installed yet: %s", type(exc).__name__)
        while not self._stop.wait(self.CHECK_EVERY_S):
            try:
                if ensure(self._client, self._config):
                    log.warning("the publish interface was gone from the broker: installed again")
            except redis.RedisError as exc:
                log.debug("the publish interface not checked: %s", type(exc).__name__)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

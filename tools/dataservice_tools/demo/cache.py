"""The demo's reads through the cache: both formats, and a stampede.

Reads are ``ALLOW_CACHED`` (the client's default). The cache is read only
while the change consumer says it is fresh, so the phase first waits for its
word. Then a sample of the records written earlier is read back with each
format as the one read (the rollout's ``read`` control, changed and put back
as an operator would with ``dataservice cache read``; every replica follows
within ``cache.controls_max_age_ms``), and a few cold records are each read
by many callers at once: concurrent misses for one key share one read.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import redis

from dataservice.cache.controls import RolloutControls
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.enums import ReadMode
from dataservice.errors import DataServiceError
from dataservice.redis.keys import CHANGES_FRESH_KEY
from dataservice.types import Record

WHO = "demo"
FRESH_WAIT_S = 20.0
STAMPEDE_KEYS = 20
STAMPEDE_READERS = 16


@dataclass
class CacheReport:
    fresh: bool = False
    # Records read back intact, per format read.
    verified: dict[str, int] = field(default_factory=dict)
    sampled: int = 0
    stampede_keys: int = 0
    stampede_reads: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        if not self.fresh:
            return True  # nothing to check: reads went to the database, as they should
        formats_ok = all(n == self.sampled for n in self.verified.values())
        return formats_ok and not self.errors

    def count(self, error: Exception) -> None:
        name = type(error).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


def _wait_fresh(client: redis.Redis, timeout_s: float) -> bool:
    stop = time.monotonic() + timeout_s
    while time.monotonic() < stop:
        if client.exists(CHANGES_FRESH_KEY):
            return True
        time.sleep(0.2)
    return False


def run_cache_phase(
    client: Client,
    config: Config,
    redis_url: str,
    records: dict[str, bytes],
    scope: str,
    sample: int = 200,
) -> CacheReport:
    """Read ``sample`` of ``records`` (id -> payload) back through each format,
    then stampede a few fresh ones; the rollout ends as it began."""
    report = CacheReport()
    admin = redis.Redis.from_url(redis_url, socket_timeout=2)
    try:
        report.fresh = _wait_fresh(admin, FRESH_WAIT_S)
        if not report.fresh:
            return report
        controls = RolloutControls(admin, config.cache)
        before = controls.fetch()
        ids = list(records)[:sample]
        report.sampled = len(ids)
        # Each format must be filled to be read: the rollout's starting fill has both.
        for fmt in sorted(before.fill, key=lambda f: f.value):
            controls.change(WHO, read=fmt)
            time.sleep(config.cache.controls_max_age_ms / 1000 + 0.2)
            report.verified[fmt.value] = _read_back(client, scope, ids, records, report)
        controls.change(WHO, read=before.read)
        _stampede(client, scope, report)
    finally:
        admin.close()
    return report


def _read_back(
    client: Client, scope: str, ids: list[str], records: dict[str, bytes], report: CacheReport
) -> int:
    verified = 0
    for object_id in ids:
        try:
            # Twice: the first may fill (a record written since its last read).
            client.read(scope, object_id)
            record = client.read(scope, object_id)
        except DataServiceError as exc:
            report.count(exc)
            continue
        verified += record.payload == records[object_id]
    return verified


def _stampede(client: Client, scope: str, report: CacheReport) -> None:
    run = time.strftime("%H%M%S")
    keys = [f"stampede-{run}-{n:02d}" for n in range(STAMPEDE_KEYS)]
    with ThreadPoolExecutor(STAMPEDE_READERS, thread_name_prefix="demo-stampede") as pool:
        for object_id in keys:
            payload = object_id.encode() * 8
            try:
                # A write invalidates: the key is cold for the readers that follow.
                client.write(scope, object_id, payload)
            except DataServiceError as exc:
                report.count(exc)
                continue
            futures = [
                pool.submit(client.read, scope, object_id, mode=ReadMode.ALLOW_CACHED)
                for _ in range(STAMPEDE_READERS)
            ]
            for future in futures:
                try:
                    record: Record = future.result()
                except DataServiceError as exc:
                    report.count(exc)
                    continue
                report.stampede_reads += record.payload == payload
            report.stampede_keys += 1

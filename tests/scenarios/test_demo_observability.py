"""A ``make demo`` run, as ``make demo`` starts it at under a third of its
records (``dataservice run --demo 300``: every phase and drill the same, both
pools, the change consumer and Flower) against a private MariaDB with a binlog: every
process's metrics endpoint, scraped while it runs, shows every stage timed and
every kind of outcome counted; and no line of any process's log holds a secret
of the callers file, Flower's password, a record's payload or its id."""

from __future__ import annotations

import base64
import http.client
import os
import random
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from dataservice.config.settings import Settings
from dataservice.observe.metrics import Stage
from tests.harness.binlog import BinlogDatabase
from tests.harness.support import on_redis, with_changes
from tests.security.test_secrets_stay_out import secret_forms

pytestmark = pytest.mark.load

DEMO_REDIS_URL = "redis://127.0.0.1:6379/3"
RECORDS = 300
FLOWER_AUTH = "ops:flower-pw-7f3a9c1e"
PROCESSES = ("interactive", "batch", "changes")


def _free_ports(n: int) -> int:
    """A base port with ``n`` free ports from it, below the ephemeral range: a
    port in that range can be an outgoing connection's before a process
    listens on it, and a connection to it can even connect to itself."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        base = random.randrange(20000, low - n)
        if all(_free(base + k) for k in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# A queue gauge's sample line: its name and lane.
QUEUE_GAUGE = re.compile(r'^(dataservice_queue_(?:messages|bytes))\{lane="(\w+)"\}', re.MULTILINE)
# The freshness guard's sample line, whatever its value.
GUARD_GAUGE = re.compile(r"^dataservice_freshness_guard\{", re.MULTILINE)
# The permits gauge's value, whatever its labels.
PERMITS_GAUGE = re.compile(r"^dataservice_permits_capacity(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


class Scraper:
    """Scrapes each endpoint four times a second, keeping the last answer, and
    the lanes each queue gauge was seen with in any answer, and which showed
    permits (a pool that is stopping has stopped watching its queues and
    permits: its last page may have none), and which showed the freshness guard."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports
        self.last: dict[str, str] = {}
        self.queue_lanes: dict[tuple[str, str], set[str]] = {}
        self.with_permits: set[str] = set()
        self.guarded: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, port in self.ports.items():
                try:
                    url = f"http://127.0.0.1:{port}/metrics"
                    with urllib.request.urlopen(url, timeout=1) as page:
                        self.last[name] = text = page.read().decode()
                    for gauge, lane in QUEUE_GAUGE.findall(text):
                        self.queue_lanes.setdefault((name, gauge), set()).add(lane)
                    if any(float(value) > 0 for value in PERMITS_GAUGE.findall(text)):
                        self.with_permits.add(name)
                    if GUARD_GAUGE.search(text):
                        self.guarded.add(name)
                except (OSError, http.client.HTTPException):
                    # Not up yet, or stopping: the next round asks again.
                    pass
            self._stop.wait(0.25)

    def stop(self) -> dict[str, Samples]:
        self._stop.set()
        self._thread.join(5)
        samples: dict[str, Samples] = {}
        for name, page in self.last.items():
            samples[name] = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(page)
                for s in family.samples
            }
        return samples


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# The demo's output, each endpoint's last page, the log directory, its settings,
# the lanes each (endpoint, queue gauge) was seen with, and the endpoints that
# showed their permits and the freshness guard.
DemoRun = tuple[
    subprocess.CompletedProcess[str],
    dict[str, Samples],
    Path,
    Settings,
    dict[tuple[str, str], set[str]],
    set[str],
    set[str],
]


def _total(samples: Samples, name: str, **want: str) -> float:
    return sum(
        value
        for (sample, labels), value in samples.items()
        if sample == name and want.items() <= dict(labels).items()
    )


@pytest.fixture
def demo_run(
    binlog_database: BinlogDatabase, settings: Settings, tmp_path: Path
) -> Iterator[DemoRun]:
    # As make demo runs: the cache read only while the change consumer keeps up.
    guarded = with_changes(settings, tmp_path / "queues.yml", {("changes", "guard"): True})
    own = binlog_database.on(on_redis(guarded, DEMO_REDIS_URL))
    broker = redis.Redis.from_url(DEMO_REDIS_URL)
    broker.flushdb()
    engine = create_engine(binlog_database.admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("DELETE FROM records WHERE scope LIKE 'demo%'"))
    base = _free_ports(4)
    ports = {name: base + n for n, name in enumerate(PROCESSES)}
    logs = tmp_path / "logs"
    argv = [sys.executable, "-m", "dataservice.cli", "run", "--demo", str(RECORDS)]
    argv += ["--log-dir", str(logs), "--metrics-port", str(base), "--flower-port", str(base + 3)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATASERVICE_")}
    env.update(own.to_env(), DATASERVICE_FLOWER_AUTH=FLOWER_AUTH)
    scraper = Scraper(ports)
    try:
        result = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=420, check=False
        )
    finally:
        scraped = scraper.stop()
    try:
        yield (
            result,
            scraped,
            logs,
            own,
            scraper.queue_lanes,
            scraper.with_permits,
            scraper.guarded,
        )
    finally:
        with engine.connect() as conn:
            conn.execute(text("DELETE FROM records WHERE scope LIKE 'demo%'"))
        engine.dispose()
        broker.flushdb()
        broker.close()


@pytest.mark.timeout(480)
def test_a_demo_run_times_every_stage_counts_every_outcome_and_logs_no_secret_or_payload(
    demo_run: DemoRun,
    binlog_database: BinlogDatabase,
) -> None:
    result, scraped, logs, settings, queue_lanes, with_permits, guarded = demo_run
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "demo passed" in result.stdout
    # Its summary: both lanes, with their latency.
    for lane in ("interactive", "batch"):
        assert lane in result.stdout
    assert "p99" in result.stdout
    assert set(scraped) == set(PROCESSES), f"endpoints that never answered: {scraped.keys()}"

    # Acceptance 2: every stage histogram has observations, and every counter
    # family named for outcomes, refusals, timeouts and dependencies moved.
    workers = [scraped["interactive"], scraped["batch"]]
    for stage in Stage:
        count = sum(
            _total(w, "dataservice_stage_seconds_count", stage=stage.value) for w in workers
        )
        # The summary says whether the cache was read (the cache line).
        assert count > 0, f"stage {stage.value} was never timed\n{result.stdout[-4000:]}"
    for name, labels in (
        ("dataservice_request_seconds_count", {}),
        ("dataservice_requests_total", {"code": "OK"}),
        ("dataservice_requests_total", {"code": "DEADLINE_EXCEEDED"}),
        ("dataservice_rejections_total", {"reason": "scope_denied"}),
        ("dataservice_timeouts_total", {"stage": "statement"}),
        ("dataservice_dependency_failures_total", {"dependency": "database"}),
        ("dataservice_admission_refusals_total", {"reason": "queue_too_long"}),
        ("dataservice_cache_reads_total", {"format": "v1", "outcome": "hit"}),
        ("dataservice_cache_reads_total", {"format": "v2", "outcome": "hit"}),
        ("dataservice_db_connections_opened_total", {}),
    ):
        assert sum(_total(w, name, **labels) for w in workers) > 0, f"{name} {labels} is zero"
    for name in ("interactive", "batch"):
        assert name in with_permits, f"{name} never showed its permits"
        for gauge in ("dataservice_queue_messages", "dataservice_queue_bytes"):
            assert queue_lanes.get((name, gauge)) == {"interactive", "batch"}, (name, gauge)
    # Any page after start: a pool's last page may come from its shutdown.
    assert guarded >= {"interactive", "batch"}, f"the freshness guard shown by {guarded}"
    consumer = scraped["changes"]
    assert _total(consumer, "dataservice_changes_active") == 1
    assert _total(consumer, "dataservice_changes_transactions_total") >= RECORDS

    # Acceptance 6: no secret and no payload in any log line.
    logged = (result.stdout + result.stderr).encode()
    logged += b"".join(log.read_bytes() for log in sorted(logs.glob("*.log")))
    assert logged.count(b"\n") > 100
    # A line per request (written in batches: all of them there once the run ends).
    assert logged.count(b'"logger":"dataservice.requests"') >= 4 * RECORDS
    needles = [*secret_forms(settings), FLOWER_AUTH.partition(":")[2].encode()]
    engine = create_engine(binlog_database.admin_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT object_id, payload FROM records WHERE scope LIKE 'demo%'")
        ).all()
    engine.dispose()
    assert len(rows) >= 2 * RECORDS
    for object_id, payload in rows:
        sample = bytes(payload)[:24]
        needles += [object_id.encode(), sample, sample.hex().encode()]
        needles += [base64.b64encode(sample)[:24], repr(sample)[2:-1].encode()]
    found = sorted({n for n in needles if len(n) >= 8 and n in logged})
    assert not found, f"{len(found)} secrets, ids or payloads in the logs, e.g. {found[:3]!r}"
    # Every log line of a process is one JSON object but Celery's own
    # shutdown notice (docs/operations.md, "Logs").
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text().splitlines():
            if line.strip() and "shutdown" not in line:
                assert line.startswith("{"), f"{log.name}: {line[:120]}"
                assert line.endswith("}"), f"{log.name}: {line[:120]}"

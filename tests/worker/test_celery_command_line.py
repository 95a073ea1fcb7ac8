"""Celery's own command line as the way in: ``celery -A workers.interactive
worker`` (and ``workers.batch``, ``workers.changes``), started as an operator
types it, in processes of their own, on the real Redis and MariaDB.

The round-trip tests of ``tests/client/test_roundtrip.py`` run again here, served by
workers Celery's command line started; ``celery inspect active`` lists a read
that a pool thread serves on the lean path, held in the database by the
injected delay (``database.injected_delay_ms``, on a worker of its own); the
start-up checks refuse what ``dataservice worker`` refuses, with the same words.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from dataservice_tools.localservices import free_port, redis_reachable
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import Client, NotFound, ReadMode, ReadOp, Record, WriteOp, WriteResult
from dataservice.broker.celery import TASK_NAME, celery_app
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.ops.processes import WorkerProcess, worker_environ

# The same tests, served by the workers below (this module's fixtures).
from tests.client.test_roundtrip import (  # noqa: F401
    test_an_uncollected_answer_is_let_go_at_deadline_plus_grace,
    test_interactive_write_read_list_delete_round_trip,
    test_list_pages_through_a_scope_in_id_order,
)
from tests.conftest import require
from tests.harness.binlog import BinlogDatabase
from tests.harness.support import changed, on_redis

ROOT = Path(__file__).resolve().parents[2]
CLI_REDIS_URL = "redis://127.0.0.1:6379/1"
# The slow worker's: every operation sleeps this long in the database first.
SLOW_REDIS_URL = "redis://127.0.0.1:6379/4"
HELD_MS = 15_000
# Every option named, as an operator would type them.
INTERACTIVE_OPTIONS = ("-P", "threads", "-c", "7", "-Q", "interactive")
HOST = socket.gethostname()


def celery_argv(*args: str) -> list[str]:
    """``celery ARGS`` as an operator types it, run by this interpreter."""
    return [sys.executable, "-m", "celery", *args]


def celery_environ(settings: Settings) -> dict[str, str]:
    """The settings' environment; ``workers`` found as from the checkout's root."""
    return {**worker_environ(settings), "PYTHONPATH": str(ROOT)}


def celery(
    settings: Settings, *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        celery_argv(*args), env=celery_environ(settings), cwd=ROOT,
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def inspect_json(settings: Settings, app: str, command: str, node: str) -> Any:
    """``celery -A APP inspect COMMAND -d NODE --json``: the node's reply."""
    done = celery(settings, "-A", app, "inspect", command, "-d", node, "--json", "-t", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)[node]


@dataclasses.dataclass
class Node:
    """A worker process started by Celery's command line, and its node name."""

    name: str
    process: WorkerProcess


def start_node(settings: Settings, log: Path, app: str, kind: str, *options: str) -> Node:
    name = f"{kind}-cli-{uuid.uuid4().hex[:8]}@{HOST}"
    argv = celery_argv("-A", app, "worker", "-n", name, "-l", "INFO", *options)
    return Node(name, WorkerProcess(argv, celery_environ(settings), log, kind).start())


def wait_answering(settings: Settings, config: Config, nodes: list[Node]) -> None:
    control = celery_app("test-control", settings, config)
    names = {node.name for node in nodes}

    def answered() -> bool:
        for node in nodes:
            node.process.check_alive()
        replies = control.control.ping(destination=sorted(names), timeout=0.5) or []
        return {str(next(iter(reply))) for reply in replies} == names

    try:
        eventually(answered, timeout=60, interval=0.1, message=f"{sorted(names)} answer a ping")
    finally:
        control.close()


@contextmanager
def own_redis(settings: Settings, url: str, **changes: object) -> Iterator[Settings]:
    """``settings`` on Redis ``url`` (flushed before and after), with each
    ``database`` key of ``changes`` set in a queues.yml of their own."""
    require(redis_reachable(url), "Redis at 127.0.0.1:6379")
    data: dict[str, Any] = yaml.safe_load(settings.config_path.read_text())
    for key, value in changes.items():
        data = changed(data, ("database", key), value)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "queues.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        client = redis.Redis.from_url(url)
        client.flushdb()
        try:
            yield on_redis(settings, url, path)
        finally:
            client.flushdb()
            client.close()


@contextmanager
def started(settings: Settings, config: Config, *nodes: Node) -> Iterator[None]:
    """The nodes, answering; stopped afterwards."""
    try:
        wait_answering(settings, config, list(nodes))
        yield
    finally:
        for node in nodes:
            node.process.stop(15)


@pytest.fixture(scope="module")
def cli_settings(settings: Settings) -> Iterator[Settings]:
    """The settings of this module's workers and clients: Redis db 1."""
    with own_redis(settings, CLI_REDIS_URL) as own:
        yield own


@pytest.fixture(scope="module")
def celery_workers(
    cli_settings: Settings,
    config: Config,
    database: Engine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Node]]:
    """The interactive lane's worker as an operator's line names every option,
    and the batch lane's as Celery's defaults leave it: the app's own."""
    logs = tmp_path_factory.mktemp("celery-cli-logs")
    nodes = {
        "interactive": start_node(
            cli_settings,
            logs / "interactive.log",
            "workers.interactive",
            "interactive",
            *INTERACTIVE_OPTIONS,
        ),
        "batch": start_node(cli_settings, logs / "batch.log", "workers.batch", "batch"),
    }
    with started(cli_settings, config, *nodes.values()):
        yield nodes


@pytest.fixture(scope="module")
def process_settings(cli_settings: Settings, celery_workers: dict[str, Node]) -> Settings:
    """What the round-trip tests' clients use: these workers serve them."""
    return cli_settings


@pytest.fixture
def cli_client(process_settings: Settings, config: Config) -> Iterator[Client]:
    with Client("tests", process_settings, config) as c:
        yield c


@pytest.mark.slow
def test_a_read_on_the_lean_path_is_listed_by_inspect_active_while_it_is_served(
    settings: Settings, config: Config, database: Engine, tmp_path: Path, scope: str
) -> None:
    slowed = {"injected_delay_ms": HELD_MS, "max_statement_ms": 2 * HELD_MS}
    with own_redis(settings, SLOW_REDIS_URL, **slowed) as slow:
        node = start_node(
            slow, tmp_path / "slow.log", "workers.interactive", "interactive", *INTERACTIVE_OPTIONS
        )
        with (
            started(slow, config, node),
            Client("tests", slow, config) as client,
            ThreadPoolExecutor(1) as caller,
        ):
            read = caller.submit(client.read, scope, "held", mode=ReadMode.PRIMARY, timeout=30)

            def listed() -> list[dict[str, Any]]:
                return inspect_json(slow, "workers.interactive", "active", node.name)

            (entry,) = eventually(
                listed,
                timeout=30.0,
                interval=0.1,
                message="the read in flight listed by inspect active",
            )
            assert not read.done()
            assert entry["name"] == TASK_NAME
            assert entry["hostname"] == node.name
            assert entry["acknowledged"] is False
            assert entry["delivery_info"]["routing_key"] == "interactive"
            # What the sender said of its arguments, never its bytes.
            assert entry["args"].startswith("<RequestEnvelope ")
            with pytest.raises(NotFound):
                read.result()
            eventually(
                lambda: not listed(),
                timeout=30.0,
                interval=0.1,
                message="the answered read off the list",
            )


@pytest.mark.slow
def test_inspect_reserved_stats_and_ping_answer_for_the_lanes_apps(
    process_settings: Settings, config: Config, celery_workers: dict[str, Node]
) -> None:
    interactive, batch = celery_workers["interactive"].name, celery_workers["batch"].name
    assert inspect_json(process_settings, "workers.interactive", "ping", interactive) == {
        "ok": "pong"
    }
    assert inspect_json(process_settings, "workers.interactive", "reserved", interactive) == []
    # The batch worker was given no option: the lane's own defaults.
    stats = inspect_json(process_settings, "workers.batch", "stats", batch)
    assert stats["pool"]["implementation"] == "celery.concurrency.thread:TaskPool"
    assert stats["pool"]["max-concurrency"] == config.lanes.batch.concurrency
    assert stats["prefetch_count"] == config.lanes.batch.concurrency  # prefetch 1 per thread
    queues = inspect_json(process_settings, "workers.batch", "active_queues", batch)
    assert [queue["name"] for queue in queues] == [config.lanes.batch.queue]


@pytest.mark.slow
def test_the_batch_lanes_worker_answers_batch_submissions(cli_client: Client, scope: str) -> None:
    writes = cli_client.submit_many(
        [WriteOp(scope, f"b{n}", bytes([n]) * 100) for n in range(20)], timeout=60
    )
    assert all(h.result() == WriteResult(f"b{n}", 1, True) for n, h in enumerate(writes))
    read = cli_client.submit(ReadOp(scope, "b7"), timeout=60).result()
    assert isinstance(read, Record)
    assert read.payload == bytes([7]) * 100


def _over_budget(settings: Settings, directory: Path) -> Settings:
    data: dict[str, Any] = yaml.safe_load(settings.config_path.read_text())
    path = directory / "over-budget.yml"
    path.write_text(yaml.safe_dump(changed(data, ("budget", "max_replicas"), 40)))
    load_config(path)  # valid, only over its budget
    return dataclasses.replace(settings, config_path=path)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("app", "options", "said"),
    [
        ("workers.batch", (), "error: the configuration exceeds the database budget: 40 replicas"),
        ("workers.interactive", ("-P", "solo"), "runs the threads pool (-P threads), not solo"),
        ("workers.interactive", ("-Q", "batch"), "consumes its own queue alone ('interactive')"),
    ],
)
def test_a_worker_that_breaks_the_budget_or_the_lane_is_refused_at_start(
    cli_settings: Settings, tmp_path: Path, app: str, options: tuple[str, ...], said: str
) -> None:
    settings = cli_settings
    if app == "workers.batch":
        settings = _over_budget(cli_settings, tmp_path)
    done = celery(settings, "-A", app, "worker", *options)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_settings_stop_the_command_before_celery_starts(
    cli_settings: Settings,
) -> None:
    environ = {**celery_environ(cli_settings), "DATASERVICE_NO_SUCH": "1"}
    done = subprocess.run(
        celery_argv("-A", "workers.interactive", "inspect", "ping"), env=environ, cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().endswith(
        "error: unknown environment variable(s): DATASERVICE_NO_SUCH"
    )


@pytest.mark.slow
def test_flower_loads_the_lanes_app_and_sees_its_workers(
    process_settings: Settings, celery_workers: dict[str, Node], tmp_path: Path
) -> None:
    port = free_port()
    argv = celery_argv(
        "-A", "workers.interactive", "flower", "--address=127.0.0.1", f"--port={port}",
        "--basic-auth=ops:ops-password",
    )  # fmt: skip
    flower = WorkerProcess(argv, celery_environ(process_settings), tmp_path / "flower.log")
    flower.start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/workers?refresh=1")
        request.add_header("Authorization", "Basic b3BzOm9wcy1wYXNzd29yZA==")  # ops:ops-password

        def workers() -> dict[str, Any]:
            flower.check_alive()
            try:
                with urllib.request.urlopen(request, timeout=10) as page:
                    found: dict[str, Any] = json.loads(page.read())
            except OSError:
                return {}
            return found if celery_workers["interactive"].name in found else {}

        seen = eventually(
            workers, timeout=60, interval=0.1, message="Flower lists the interactive worker"
        )
    finally:
        flower.stop(10)
    assert celery_workers["batch"].name in seen


@pytest.mark.slow
def test_the_change_consumers_app_runs_its_node_and_refuses_a_server_without_a_binlog(
    binlog_database: BinlogDatabase, cli_settings: Settings, config: Config, tmp_path: Path
) -> None:
    # The tests' MariaDB has no binlog: the node names what is missing, exit 2.
    no_binlog = dataclasses.replace(cli_settings, changes_database_url=cli_settings.database_url)
    refused = celery(no_binlog, "-A", "workers.changes", "worker")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "\nerror: MariaDB " in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    settings = binlog_database.on(cli_settings)
    node = start_node(settings, tmp_path / "changes.log", "workers.changes", "changes")
    try:
        wait_answering(settings, config, [node])
        state = eventually(
            lambda: inspect_json(settings, "workers.changes", "dataservice_changes", node.name),
            timeout=30.0,
            interval=0.1,
            message="the consumer's state over the control channel",
        )
        assert state["role"] in ("active", "standby")
        queues = inspect_json(settings, "workers.changes", "active_queues", node.name)
        assert [queue["name"] for queue in queues] == ["changes"]
    finally:
        node.process.stop(15)

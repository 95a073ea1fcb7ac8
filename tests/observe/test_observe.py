"""What the service says about itself: log lines (JSON, one per request, the
documented fields only), stage timings (only of a request, and however a
stage ends), and the lanes' task events as queues.yml asks for them."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from dataservice_tools.testkit.waits import eventually

from dataservice import Client, ReadMode
from dataservice.broker.celery import celery_app
from dataservice.codec.requests import MESSAGE_OPERATIONS
from dataservice.config.model import Config, LoggingConfig
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.observe import trace as tracing
from dataservice.observe.lines import RequestLines
from dataservice.observe.logs import JsonFormatter, configure_logging, stop_request_lines
from dataservice.observe.metrics import REGISTRY, Stage
from dataservice.observe.requestlog import RequestLog
from tests.harness.support import TaskEvents, on_redis, with_changes, worker_process
from tests.project.test_docs import table

EVENTS_REDIS_URL = "redis://127.0.0.1:6379/4"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _count(lane: str, stage: Stage) -> float:
    value = REGISTRY.get_sample_value(
        "dataservice_stage_seconds_count", {"lane": lane, "stage": stage.value}
    )
    return value or 0.0


def test_a_stage_is_timed_only_inside_a_request_and_however_it_ends() -> None:
    lane = f"test-{uuid.uuid4().hex[:6]}"
    with tracing.timed(Stage.SQL):
        pass  # no request: nothing is timed
    assert _count(lane, Stage.SQL) == 0
    trace = tracing.begin(lane, "r1")
    with pytest.raises(ValueError, match="boom"), tracing.timed(Stage.SQL):
        raise ValueError("boom")
    tracing.record(Stage.SQL, 0.002)
    assert tracing.detach() is trace
    assert _count(lane, Stage.SQL) == 2
    assert trace.stages["sql"] >= 2.0
    tracing.record(Stage.SQL, 1.0)  # detached: no longer this request's
    assert _count(lane, Stage.SQL) == 2


def test_a_trace_handed_to_another_thread_goes_on_there() -> None:
    lane = f"test-{uuid.uuid4().hex[:6]}"
    trace = tracing.begin(lane, "r2")
    tracing.detach()

    def pool_thread() -> None:
        tracing.resume(trace)
        tracing.record(Stage.PERMIT_WAIT, 0.001)
        tracing.detach()

    thread = threading.Thread(target=pool_thread)
    thread.start()
    thread.join()
    assert set(trace.stages) == {"permit_wait"}


def _log_lines(mode: str, status: str, *, batched: bool = True) -> list[dict[str, Any]]:
    """The lines a request's end writes: in batches (as configure_logging
    sets up JSON logs), or through ``logging`` with the JSON formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("dataservice.requests")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    lines = RequestLines(handler) if batched else None
    try:
        trace = tracing.begin("interactive", "req-1")
        trace.caller, trace.operation = "billing", "read"
        tracing.record(Stage.GATE, 0.0005)
        tracing.detach()
        RequestLog("interactive", mode, MESSAGE_OPERATIONS, lines).finish(trace, status)  # type: ignore[arg-type]
    finally:
        if lines is not None:
            lines.close()
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize("batched", [True, False])
def test_a_request_line_holds_the_documented_fields_and_nothing_else(batched: bool) -> None:
    (line,) = _log_lines("all", "OK", batched=batched)
    documented = {row["field"].strip("`") for row in table(OPERATIONS, "field").rows}
    assert set(line) - {"ts", "level", "logger", "msg"} == documented
    assert line["request_id"] == "req-1"
    assert (line["caller"], line["lane"], line["operation"]) == ("billing", "interactive", "read")
    assert line["status"] == "OK"
    assert line["stages_ms"] == {"gate": 0.5}
    assert line["total_ms"] >= 0


@pytest.mark.parametrize(
    ("mode", "status", "lines"),
    [
        ("all", "OK", 1),
        ("failures", "OK", 0),
        ("failures", "UNAVAILABLE", 1),
        ("none", "INTERNAL", 0),
    ],
)
def test_request_lines_follow_logging_requests(mode: str, status: str, lines: int) -> None:
    assert len(_log_lines(mode, status)) == lines


def test_every_log_record_is_one_json_object_per_line() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(LoggingConfig(format="json"), "INFO", stream)
        try:
            raise RuntimeError("went wrong\nover two lines")
        except RuntimeError:
            logging.getLogger("some.module").exception("failed %s", "here")
    finally:
        stop_request_lines()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    (text,) = stream.getvalue().splitlines()
    line = json.loads(text)
    assert (line["level"], line["logger"], line["msg"]) == ("ERROR", "some.module", "failed here")
    assert "RuntimeError: went wrong" in line["exc"]
    assert line["ts"].endswith("Z")


@pytest.fixture
def events_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(EVENTS_REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("task_events", [True, False])
def test_a_lane_sends_task_events_only_when_queues_yml_says_so(
    task_events: bool,
    events_redis: redis.Redis,
    settings: Settings,
    config: Config,
    database: object,
    tmp_path: Path,
) -> None:
    own = on_redis(
        with_changes(
            settings,
            tmp_path / "queues.yml",
            {("lanes", "interactive", "task_events"): task_events},
        ),
        EVENTS_REDIS_URL,
    )
    own_config = own.load()
    app = celery_app("test-events", own, own_config)
    events = TaskEvents(app)
    try:
        with (
            worker_process(own, own_config, LaneName.INTERACTIVE, tmp_path / "w.log"),
            Client("tests", own, own_config) as client,
        ):
            # Heartbeats are always sent: the first says the receiver listens.
            eventually(
                lambda: any(e["type"] == "worker-heartbeat" for e in events.seen), timeout=10
            )
            client.write("events", "e1", b"x")
            client.read("events", "e1", mode=ReadMode.PRIMARY)
            if task_events:
                eventually(lambda: "task-succeeded" in {e["type"] for e in events.seen}, timeout=10)
            else:
                # Events would have followed the answers within a heartbeat or so.
                time.sleep(1.5)
                assert not [e for e in events.seen if e["type"].startswith("task-")]
    finally:
        events.close()
        app.close()

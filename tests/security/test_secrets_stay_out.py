"""Acceptance: caller keys never appear in logs, metrics or error messages.

A worker process runs at DEBUG with its metrics served over HTTP; requests
succeed, fail and are refused for every authentication reason; then its
log, its metrics page, this process's captured log and every error message
the callers saw are searched for each secret, in every form it takes.
"""

from __future__ import annotations

import base64
import logging
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from dataservice_tools.localservices import redis_reachable
from prometheus_client import generate_latest

from dataservice import Client, DataServiceError, ReadMode
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.observe.metrics import REGISTRY
from dataservice.proto import pb
from dataservice.security.callers import CallerKey, Secret, load_keyring
from tests.conftest import require
from tests.harness.support import now_ms, on_redis, signed, worker_process

OWN_REDIS_URL = "redis://127.0.0.1:6379/8"


def secret_forms(settings: Settings) -> list[bytes]:
    """Every secret of the callers file, as text, raw bytes, hex and URL-safe base64."""
    assert settings.callers_file is not None
    document = yaml.safe_load(settings.callers_file.read_text())
    forms: list[bytes] = []
    for entry in document["callers"].values():
        for key in entry["keys"]:
            raw = base64.b64decode(key["secret"])
            forms += [
                key["secret"].encode(),
                raw,
                raw.hex().encode(),
                base64.urlsafe_b64encode(raw),
            ]
        if entry.get("redis_password"):
            forms.append(entry["redis_password"].encode())
    forms.append(document["workers"]["redis_password"].encode())
    return forms


@pytest.fixture
def debug_worker(
    settings: Settings, config: Config, tmp_path: Path
) -> Iterator[tuple[Settings, Path, int]]:
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    own = on_redis(settings, OWN_REDIS_URL)
    redis.Redis.from_url(OWN_REDIS_URL).flushdb()
    log = tmp_path / "worker.log"
    try:
        with worker_process(own, config, LaneName.INTERACTIVE, log, "--loglevel", "DEBUG") as (
            _,
            port,
        ):
            yield own, log, port
    finally:
        redis.Redis.from_url(OWN_REDIS_URL).flushdb()


@pytest.mark.timeout(120)
def test_no_secret_in_logs_metrics_or_errors(
    debug_worker: tuple[Settings, Path, int],
    config: Config,
    database: object,
    scope: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings, log, port = debug_worker
    caplog.set_level(logging.DEBUG)
    keyring = load_keyring(settings.callers_file)
    messages: list[str] = []
    with Client("tests", settings, config) as client:
        client.write(scope, "a", b"payload")
        client.read(scope, "a", mode=ReadMode.PRIMARY)
        for attempt in (
            lambda: client.read(scope, "missing"),
            lambda: client.write(scope, "a", b"x", expected_revision=99),
        ):
            try:
                attempt()
            except DataServiceError as exc:
                messages.append(str(exc))
    # Refused for each way a signature can be wrong, and for permissions.
    real = keyring.signing_key("tests")
    wrong_secret = CallerKey("tests", real.key_id, Secret(b"\x01" * 32))
    unknown = CallerKey("tests", "nobody-1", Secret(b"\x02" * 32))
    narrow = keyring.signing_key("tests-narrow")
    transport = Transport(settings, config)
    try:
        for caller, key in (("tests", wrong_secret), ("tests", unknown), ("tests", narrow),
                            ("tests-narrow", narrow)):  # fmt: skip
            envelope = pb.RequestEnvelope(
                caller=caller, request_id=uuid.uuid4().hex, deadline_unix_ms=now_ms() + 5000,
                issued_at_unix_ms=now_ms(),
                write=pb.WriteRecordRequest(scope=scope, object_id="a", payload=b"x"),
                idempotency_key="k",
            )  # fmt: skip
            transport.publish(
                signed(envelope, key), request_id=envelope.request_id,
                lane=LaneName.INTERACTIVE, deadline_ms=now_ms() + 5000,
            )  # fmt: skip
            answer = transport.results.wait(key.caller, envelope.request_id, 5.0)
            assert answer is not None
            messages.append(pb.ResponseEnvelope.FromString(answer).status.message)
    finally:
        transport.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        metrics = page.read()
    assert b'reason="bad_signature"' in metrics
    assert b'reason="unknown_key"' in metrics

    worker_log = log.read_bytes()
    assert b"DEBUG" in worker_log  # the worker did log at DEBUG
    places = {
        "worker log": worker_log,
        "worker metrics": metrics,
        "this process's metrics": generate_latest(REGISTRY),
        "this process's log": caplog.text.encode(),
        "error messages": "\n".join(messages).encode(),
    }
    for form in secret_forms(settings):
        for where, text in places.items():
            assert form not in text, f"a secret appears in the {where}"

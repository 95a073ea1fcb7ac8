"""The golden vectors (``dataservice/proto/access/v2/vectors.json``) are what
the Python client makes, what the workers accept, and what ``ds_publish_v2``
queues: a change of the wire format fails here until the file is made again
(``python -m dataservice_tools.vectors --write``) and the change is deliberate."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from dataservice_tools import vectors
from google.protobuf import json_format

from dataservice.broker import library
from dataservice.codec import decode_request
from dataservice.codec.envelopes import decode_response
from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.errors import RequestError, RetryableError
from dataservice.proto import pb
from dataservice.types import DeleteResult, Page, ReadMany, Record, WriteResult
from tests.conftest import require
from tests.harness.support import with_publish_interface

# No worker serves this database (tests/broker/test_library.py uses it alike).
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/12"
VECTORS: dict[str, Any] = json.loads(vectors.PATH.read_text(encoding="utf-8"))
REQUESTS = {v["name"]: v for v in VECTORS["requests"]}
ANSWERS = {v["name"]: v for v in VECTORS["answers"]}
SECRET = bytes.fromhex(VECTORS["key"]["secret_hex"])


def test_the_file_is_what_the_code_makes(config: Config) -> None:
    assert vectors.PATH.read_text(encoding="utf-8") == vectors.text(config.limits)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_each_request_is_signed_over_its_envelope_and_the_workers_read_it(
    name: str, config: Config
) -> None:
    vector = REQUESTS[name]
    envelope = bytes.fromhex(vector["envelope_hex"])
    signed = pb.SignedRequest.FromString(bytes.fromhex(vector["signed_request_hex"]))
    assert signed.envelope == envelope
    assert signed.key_id == VECTORS["key"]["key_id"]
    expected = hmac.new(SECRET, envelope, hashlib.sha256).digest()
    assert signed.signature == expected == bytes.fromhex(vector["signature_hex"])
    lane = config.lanes[LaneName(vector["lane"])]
    parsed = decode_request(envelope, config.limits, max_ops=lane.max_ops_per_message)
    assert json_format.MessageToDict(parsed, preserving_proto_field_name=True) == vector["envelope"]
    # The publish call's request is the SignedRequest in base64.
    lane_name, request_id, caller, deadline, operation, ops, request = vector["publish_args"]
    assert (lane_name, request_id, caller) == (vector["lane"], parsed.request_id, parsed.caller)
    assert int(deadline) == parsed.deadline_unix_ms
    assert operation == parsed.WhichOneof("operation")
    assert base64.b64decode(request, validate=True) == signed.SerializeToString()
    assert int(ops) >= 1


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_each_answer_reads_as_the_python_client_reads_it(name: str) -> None:
    vector = ANSWERS[name]
    body = bytes.fromhex(vector["response_hex"])
    response = pb.ResponseEnvelope.FromString(body)
    assert (
        json_format.MessageToDict(response, preserving_proto_field_name=True) == vector["response"]
    )
    if response.WhichOneof("result") == "batch":
        # A batch's answer holds each operation's, as it would have had alone.
        for inner in response.batch.answers:
            _read(inner.SerializeToString(), inner.request_id, inner.status)
        return
    _read(body, response.request_id, response.status)


def _read(body: bytes, request_id: str, status: pb.Status) -> None:
    if status.code == pb.STATUS_CODE_OK:
        result = decode_response(body, request_id)
        assert isinstance(result, Record | WriteResult | DeleteResult | Page | ReadMany)
        return
    with pytest.raises(RequestError) as raised:
        decode_response(body, request_id)
    error = raised.value
    assert error.reason == status.reason
    if status.retry_after_ms:
        assert isinstance(error, RetryableError)
        assert error.retry_after == status.retry_after_ms / 1000


@pytest.fixture
def unserved(config: Config) -> Iterator[redis.Redis]:
    with with_publish_interface(UNSERVED_REDIS_URL, config) as client:
        yield client


def test_each_requests_publish_arguments_are_queued_as_its_signed_request(
    unserved: redis.Redis, config: Config
) -> None:
    # The vectors' deadlines are fixed, in 2096: each request has time left.
    assert time.time() * 1000 < min(int(v["publish_args"][3]) for v in REQUESTS.values())
    for vector in REQUESTS.values():
        answer = unserved.execute_command("FCALL", library.PUBLISH, 0, *vector["publish_args"])
        assert answer[0] == b"", (vector["name"], answer)
        queue = config.lanes[LaneName(vector["lane"])].queue
        raw = unserved.lpop(queue)
        assert raw is not None, (vector["name"], queue, unserved.keys("*"))
        entry = json.loads(raw)
        assert entry["body"] == vector["publish_args"][-1]
        assert entry["headers"]["id"] == vector["publish_args"][1]


def test_the_node_caller_makes_and_reads_what_the_vectors_say() -> None:
    """Another implementation checks itself against the same file: the Node
    caller in examples/node (its ``npm test``)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "node"
    node = shutil.which("node")
    require(node is not None, "Node.js (scripts/bootstrap.sh installs it)")
    require((example / "node_modules").is_dir(), "examples/node's packages (npm ci)")
    done = subprocess.run(
        [str(node), "--test", "test/vectors.test.js"],
        cwd=example,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

"""The Python clients as a caller program of the conformance interface
(docs/conformance.md): ``python -m dataservice_tools.conformance.adapter``.

Proper calls go through :class:`dataservice.Client`, one per caller, key and
retry setting, run at once on threads as a service's threads would call it.
It always answers on its reply channel. The three requests a client never
sends (a flipped signature bit, no signature, a message sent twice) are made
from the client's own parts: the envelope and signature of
:mod:`dataservice.codec` and :mod:`dataservice.security.auth`, published by
its transport and awaited under the request's own key.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from dataservice.client import Client
from dataservice.client.handle import now_ms
from dataservice.client.publisher import new_request_id
from dataservice.client.transport import Transport
from dataservice.codec import request_envelope
from dataservice.codec.envelopes import decode_response
from dataservice.codec.records import unix_ms
from dataservice.config.model import ClientConfig, Config, RetryConfig, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import DataServiceError, RequestError
from dataservice.limits.admission import AdmissionRefused
from dataservice.proto import pb
from dataservice.security.auth import sign
from dataservice.security.callers import CallerKey, Secret
from dataservice.types import (
    DeleteOp,
    DeleteResult,
    ListOp,
    Operation,
    Page,
    ReadOp,
    Record,
    Result,
    WriteOp,
    WriteResult,
)
from dataservice_tools.conformance.interface import (
    CALLER_ERROR,
    NO_ANSWER,
    Hello,
    Outcome,
    b64,
    dumps,
    loads,
    unb64,
)

MODES = {"allow_cached": ReadMode.ALLOW_CACHED, "primary": ReadMode.PRIMARY}
# Calls run at once: the runner's widest case sends 20.
THREADS = 32


def record_line(record: Record) -> dict[str, Any]:
    return {
        "object_id": record.object_id,
        "revision": record.revision,
        "payload_b64": b64(record.payload),
        "updated_at_unix_ms": unix_ms(record.updated_at),
    }


def result_line(result: Result) -> dict[str, Any]:
    """A result as the interface has it (docs/conformance.md, "Results")."""
    if isinstance(result, Record):
        return {"record": record_line(result)}
    if isinstance(result, WriteResult):
        return {"object_id": result.object_id, "revision": result.revision,
                "created": result.created}  # fmt: skip
    if isinstance(result, DeleteResult):
        return {"object_id": result.object_id, "revision": result.revision}
    if isinstance(result, Page):
        return {"records": [record_line(r) for r in result.records],
                "next_cursor": result.next_cursor or ""}  # fmt: skip
    raise TypeError(f"no interface line for {type(result).__name__}")


def error_outcome(error: RequestError, **fields: Any) -> Outcome:
    retry_after = getattr(error, "retry_after", 0.0)
    return Outcome(error.code.name, error.reason, round(retry_after * 1000), **fields)


def caller_key(call: dict[str, Any]) -> CallerKey:
    """The key a call signs with."""
    return CallerKey(call["caller"], call["key_id"], Secret(bytes.fromhex(call["secret_hex"])))


def operation(call: dict[str, Any]) -> Operation:
    """The client's operation for a call's ``op`` and fields (``batch``'s
    parts included)."""
    op = call["op"]
    if op == "read":
        return ReadOp(call["scope"], call["object_id"], MODES[call["mode"]])
    if op == "write":
        return WriteOp(
            call["scope"],
            call["object_id"],
            unb64(call["payload_b64"]),
            call["idempotency_key"],
            call.get("expected_revision", 0),
        )
    if op == "delete":
        return DeleteOp(
            call["scope"],
            call["object_id"],
            call["idempotency_key"],
            call.get("expected_revision", 0),
        )
    if op == "list":
        return ListOp(call["scope"], call.get("page_size", 0), call.get("cursor") or None)
    raise ValueError(f"no single operation {op!r}")


class Adapter:
    """The calls of one run, against the service the hello names."""

    def __init__(self, hello: Hello) -> None:
        if not hello.config_path:
            raise ValueError("the Python client needs the workers' configuration (config_path)")
        self.settings = Settings(
            config_path=Path(hello.config_path),
            broker_url=hello.broker_url,
            result_backend_url=hello.results_url,
            redis_url=hello.results_url,
        )
        self.config = load_config(self.settings.config_path)
        self._once = _one_attempt(self.config)
        self._clients: dict[tuple[str, str, bytes, bool], Client] = {}
        self._made = threading.Lock()
        self._raw = Transport(self.settings, self.config)

    def client(self, call: dict[str, Any]) -> Client:
        key = caller_key(call)
        retry = bool(call.get("retry", True))
        name = (key.caller, key.key_id, key.secret.value, retry)
        with self._made:
            if name not in self._clients:
                config = self.config if retry else self._once
                self._clients[name] = Client(key.caller, self.settings, config, key=key)
            return self._clients[name]

    def run(self, call: dict[str, Any]) -> Outcome:
        if call.get("tamper"):
            return self._tampered(call)
        client = self.client(call)
        timeout = call["timeout_ms"] / 1000
        try:
            if call["op"] == "batch":
                return self._batch(client, call, timeout)
            if call["op"] == "read_many":
                return self._read_many(client, call, timeout)
            op = operation(call)
            result = _CALLS[type(op)](client, op, timeout)
        except RequestError as error:
            # Whether a refusal came as an answer or from the publish, the
            # client does not say: no channel is claimed for it.
            return error_outcome(error)
        return Outcome("OK", reply_channel=client.reply_channel, result=result_line(result))

    def _read_many(self, client: Client, call: dict[str, Any], timeout: float) -> Outcome:
        reads = call["reads"]
        modes = {read["mode"] for read in reads}
        if len(modes) != 1:
            raise ValueError("the Python client reads many records in one mode")
        ids = [(read["scope"], read["object_id"]) for read in reads]
        results = client.read_many("", ids, mode=MODES[modes.pop()], timeout=timeout)
        lines = [
            {"status": "OK", "reason": "", "record": record_line(one)}
            if isinstance(one, Record)
            else {"status": one.code.name, "reason": one.reason}
            for one in results
        ]
        return Outcome("OK", reply_channel=client.reply_channel, result={"results": lines})

    def _batch(self, client: Client, call: dict[str, Any], timeout: float) -> Outcome:
        operations = [operation(part) for part in call["operations"]]
        handles = client.submit_many(operations, timeout=timeout)
        answers: list[dict[str, Any]] = []
        for one in client.results(handles):
            if isinstance(one, RequestError):
                answers.append({"status": one.code.name, "reason": one.reason})
            elif isinstance(one, DataServiceError):
                answers.append({"status": CALLER_ERROR, "reason": "", "message": str(one)})
            else:
                answers.append({"status": "OK", "reason": "", "result": result_line(one)})
        return Outcome("OK", reply_channel=client.reply_channel, result={"answers": answers})

    # Requests the client never sends --------------------------------------------------

    def _tampered(self, call: dict[str, Any]) -> Outcome:
        key = caller_key(call)
        lane = LaneName(call["lane"])
        request_id = new_request_id()
        deadline_ms = now_ms() + call["timeout_ms"]
        op = operation(call)
        envelope = request_envelope(
            key.caller,
            op,
            request_id=request_id,
            deadline_ms=deadline_ms,
            issued_at_ms=now_ms(),
            idempotency_key=call.get("idempotency_key", ""),
            limits=self.config.limits,
        ).SerializeToString()
        body = _tamper(call["tamper"], envelope, key)

        def publish_and_wait() -> Outcome:
            try:
                self._raw.publish(
                    body,
                    request_id=request_id,
                    lane=lane,
                    deadline_ms=deadline_ms,
                    caller=key.caller,
                    operation=call["op"],
                )
            except AdmissionRefused as refused:
                return error_outcome(refused.error(), attempts=1)
            left_s = max(deadline_ms - now_ms(), 0) / 1000
            answer = self._raw.results.wait(key.caller, request_id, left_s)
            if answer is None:
                return Outcome(NO_ANSWER, attempts=1)
            try:
                result = decode_response(answer, request_id)
            except RequestError as error:
                return error_outcome(error, attempts=1)
            return Outcome("OK", attempts=1, result=result_line(result))

        first = publish_and_wait()
        if call["tamper"] != "replay":
            return first
        again = publish_and_wait()
        return replace(first, attempts=2, replay={"status": again.status, "reason": again.reason})

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._raw.close()


def _tamper(how: str, envelope: bytes, key: CallerKey) -> bytes:
    """The body to publish: signed as it should be (``replay``), with the
    signature's lowest bit of its first byte flipped, or without a signature."""
    if how == "unsigned":
        return pb.SignedRequest(envelope=envelope).SerializeToString()
    signed = sign(envelope, key)
    if how == "replay":
        return signed
    if how != "signature":
        raise ValueError(f"unknown tamper {how!r}")
    message = pb.SignedRequest.FromString(signed)
    message.signature = bytes([message.signature[0] ^ 1]) + message.signature[1:]
    return message.SerializeToString()


def _one_attempt(config: Config) -> Config:
    """``config`` with the client's retries off."""
    retry = config.client.retry
    single = RetryConfig(
        max_attempts=1, backoff_base_ms=retry.backoff_base_ms, backoff_max_ms=retry.backoff_max_ms
    )
    return config.model_copy(update={"client": ClientConfig(retry=single)})


_CALLS: dict[type, Callable[[Client, Any, float], Result]] = {
    ReadOp: lambda c, op, t: c.read(op.scope, op.object_id, mode=op.mode, timeout=t),
    WriteOp: lambda c, op, t: c.write(
        op.scope,
        op.object_id,
        op.payload,
        idempotency_key=op.idempotency_key,
        expected_revision=op.expected_revision,
        timeout=t,
    ),
    DeleteOp: lambda c, op, t: c.delete(
        op.scope,
        op.object_id,
        idempotency_key=op.idempotency_key,
        expected_revision=op.expected_revision,
        timeout=t,
    ),
    ListOp: lambda c, op, t: c.list(op.scope, page_size=op.page_size, cursor=op.cursor, timeout=t),
}


def serve(stdin: TextIO, stdout: TextIO) -> None:
    """Answer the runner's lines until it closes ``stdin``."""
    hello = Hello.parse(loads(stdin.readline()))
    adapter = Adapter(hello)
    written = threading.Lock()

    def say(line: dict[str, Any]) -> None:
        with written:
            stdout.write(dumps(line) + "\n")
            stdout.flush()

    def answer(call: dict[str, Any]) -> None:
        try:
            outcome = adapter.run(call)
        except Exception as exc:
            # Every call is answered: the runner waits for each.
            outcome = Outcome(CALLER_ERROR, message=f"{type(exc).__name__}: {exc}")
        say(outcome.line(str(call["id"])))

    say({"type": "ready", "name": "dataservice Python client (adapter)"})
    with ThreadPoolExecutor(THREADS) as pool:
        for text in stdin:
            if text.strip():
                pool.submit(answer, loads(text))
    adapter.close()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)

"""The lines of the conformance interface (docs/conformance.md, "The
interface"): what the runner writes and what it reads back."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from dataservice.errors import DataServiceError

VERSION = 1
# The answer a caller gives when it sent nothing that was answered in time,
# and the status of a failure of the caller itself.
NO_ANSWER = "DEADLINE_EXCEEDED"
CALLER_ERROR = "ERROR"


class CallerInterfaceError(DataServiceError):
    """The caller program under test broke the interface: a line it should
    not write, one it did not write in time, or its exit."""


@dataclass(frozen=True, slots=True)
class Key:
    """Who calls, and the key it signs with."""

    caller: str
    key_id: str
    secret: bytes

    def fields(self) -> dict[str, str]:
        return {"caller": self.caller, "key_id": self.key_id, "secret_hex": self.secret.hex()}


@dataclass(frozen=True, slots=True)
class Hello:
    broker: str  # "redis" or "rabbitmq"
    broker_url: str
    results_url: str
    lanes: dict[str, dict[str, str | int]]
    # The configuration the workers run: for a caller that reads queues.yml.
    config_path: str = ""

    def line(self) -> dict[str, Any]:
        return {
            "type": "hello",
            "version": VERSION,
            "broker": self.broker,
            "broker_url": self.broker_url,
            "results_url": self.results_url,
            "lanes": self.lanes,
            "config_path": self.config_path,
        }

    @classmethod
    def parse(cls, line: dict[str, Any]) -> Hello:
        if line.get("type") != "hello" or line.get("version") != VERSION:
            raise CallerInterfaceError(f"expected a hello of version {VERSION}, got {line!r}")
        return cls(
            line["broker"],
            line["broker_url"],
            line["results_url"],
            line["lanes"],
            line.get("config_path", ""),
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    """A caller's result for one call."""

    status: str
    reason: str = ""
    retry_after_ms: int = 0
    attempts: int = 0
    reply_channel: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    replay: dict[str, Any] | None = None
    message: str = ""

    @classmethod
    def parse(cls, line: dict[str, Any]) -> Outcome:
        """A result line, each field checked for its type."""

        def field(name: str, kind: type, default: Any) -> Any:
            value = line.get(name)
            if value is None:
                return default
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise CallerInterfaceError(f"a result's {name} is not a {kind.__name__}: {line!r}")
            return value

        if line.get("type") != "result" or not isinstance(line.get("status"), str):
            raise CallerInterfaceError(f"expected a result, got {line!r}")
        return cls(
            status=line["status"],
            reason=field("reason", str, ""),
            retry_after_ms=field("retry_after_ms", int, 0),
            attempts=field("attempts", int, 0),
            reply_channel=field("reply_channel", str, ""),
            result=field("result", dict, {}),
            replay=field("replay", dict, None),
            message=field("message", str, ""),
        )

    def line(self, call_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "result",
            "id": call_id,
            "status": self.status,
            "reason": self.reason,
            "retry_after_ms": self.retry_after_ms,
            "attempts": self.attempts,
            "reply_channel": self.reply_channel,
        }
        if self.result:
            out["result"] = self.result
        if self.replay is not None:
            out["replay"] = self.replay
        if self.message:
            out["message"] = self.message
        return out

    def describe(self) -> str:
        """The outcome in a few words, for a failed case's line."""
        said = self.status + (f" ({self.reason})" if self.reason else "")
        return said + (f": {self.message}" if self.message else "")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def dumps(line: dict[str, Any]) -> str:
    """One line of the interface: compact JSON, no newline inside."""
    return json.dumps(line, separators=(",", ":"))


def loads(text: str) -> dict[str, Any]:
    try:
        line = json.loads(text)
    except ValueError as exc:
        raise CallerInterfaceError(f"not a JSON line: {text[:200]!r} ({exc})") from None
    if not isinstance(line, dict):
        raise CallerInterfaceError(f"not a JSON object: {text[:200]!r}")
    return line

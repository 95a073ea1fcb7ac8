"""The cases (docs/conformance.md, "The cases"): each asks the caller for
calls, then checks what it reported and what the service did. A case returns
its problems; none means it passed. They run in order, on records of the
run's own scope, and some build on the records an earlier one left."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dataservice_tools.conformance.fleet import CALLER, PACED, PACED_RATE_PER_S, Fleet
from dataservice_tools.conformance.interface import NO_ANSWER, Key, Outcome, b64
from dataservice_tools.conformance.program import CallerProgram

INTERACTIVE_TIMEOUT_MS = 5_000
BATCH_TIMEOUT_MS = 30_000
# A replayed copy is waited for until the deadline: short, so the case is.
REPLAY_TIMEOUT_MS = 2_000
# The worker's counters and the database may trail an answer by this much.
SETTLE_S = 2.0
LIST_RECORDS = 5
LIST_PAGE = 2
BATCH_WRITES = 50
CHANNEL_READS = 20


@dataclass
class Run:
    """What the cases share: the caller under test, the service, the run's scope."""

    program: CallerProgram
    fleet: Fleet
    scope: str
    caller: Key
    paced: Key

    @classmethod
    def new(cls, program: CallerProgram, fleet: Fleet) -> Run:
        return cls(
            program,
            fleet,
            f"conformance-{os.urandom(4).hex()}",
            fleet.key(CALLER),
            fleet.key(PACED),
        )

    def call(
        self,
        op: str,
        *,
        key: Key | None = None,
        lane: str = "interactive",
        timeout_ms: int = INTERACTIVE_TIMEOUT_MS,
        retry: bool = True,
        reply_channel: bool = False,
        tamper: str = "",
        **fields: Any,
    ) -> dict[str, Any]:
        """One call's line, but for its id."""
        return {
            **(key or self.caller).fields(),
            "lane": lane,
            "timeout_ms": timeout_ms,
            "retry": retry,
            "reply_channel": reply_channel,
            "tamper": tamper,
            "op": op,
            **fields,
        }

    def write(self, object_id: str, payload: bytes, **fields: Any) -> dict[str, Any]:
        fields.setdefault("idempotency_key", f"w-{os.urandom(8).hex()}")
        fields.setdefault("expected_revision", 0)
        return self.call(
            "write", scope=self.scope, object_id=object_id, payload_b64=b64(payload), **fields
        )

    def read(self, object_id: str, mode: str = "primary", **fields: Any) -> dict[str, Any]:
        return self.call("read", scope=self.scope, object_id=object_id, mode=mode, **fields)

    def stored(self) -> dict[str, tuple[int, bytes]]:
        return self.fleet.records(self.scope)


Check = Callable[[Run], list[str]]


@dataclass(frozen=True)
class Case:
    name: str
    run: Check


def expect(outcome: Outcome, status: str, reason: str | None = None, what: str = "") -> list[str]:
    """The problem, if ``outcome`` is not ``status`` (with ``reason``, when given)."""
    ok = outcome.status == status and (reason is None or outcome.reason == reason)
    wanted = status + (f" ({reason})" if reason else "")
    where = f"{what}: " if what else ""
    return [] if ok else [f"{where}expected {wanted}, got {outcome.describe()}"]


def same(got: object, wanted: object, what: str) -> list[str]:
    return [] if got == wanted else [f"{what}: expected {wanted!r}, got {got!r}"]


def record_problems(outcome: Outcome, object_id: str, revision: int, payload: bytes) -> list[str]:
    record = outcome.result.get("record") or {}
    return (
        same(record.get("object_id"), object_id, "record's object_id")
        + same(record.get("revision"), revision, "record's revision")
        + same(record.get("payload_b64"), b64(payload), "record's payload")
    )


def stored_problems(run: Run, object_id: str, wanted: tuple[int, bytes] | None) -> list[str]:
    """The problem, if the database does not hold ``wanted`` (revision,
    payload; None: no record) for ``object_id``."""
    return same(run.stored().get(object_id), wanted, f"database's record {object_id!r}")


# The record ``a``'s life: written, read, updated, refused, deleted -------------------------

PAYLOAD_1 = b"first \x00\xff payload"
PAYLOAD_2 = b"second payload"


def _written(run: Run, payload: bytes, revision: int) -> list[str]:
    """Write ``payload`` over record ``a``: answered at ``revision`` (created
    at 1), and so in the database."""
    outcome = run.program.call(run.write("a", payload))
    problems = expect(outcome, "OK")
    if not problems:
        wanted = {"object_id": "a", "revision": revision, "created": revision == 1}
        problems += same(outcome.result, wanted, "result")
    return problems + stored_problems(run, "a", (revision, payload))


def write_case(run: Run) -> list[str]:
    return _written(run, PAYLOAD_1, 1)


def read_primary_case(run: Run) -> list[str]:
    outcome = run.program.call(run.read("a", "primary"))
    return expect(outcome, "OK") or record_problems(outcome, "a", 1, PAYLOAD_1)


def read_cached_case(run: Run) -> list[str]:
    problems = []
    for n in (1, 2):
        outcome = run.program.call(run.read("a", "allow_cached"))
        problems += expect(outcome, "OK", what=f"read {n}") or record_problems(
            outcome, "a", 1, PAYLOAD_1
        )
    return problems


def update_case(run: Run) -> list[str]:
    return _written(run, PAYLOAD_2, 2)


def conflict_case(run: Run) -> list[str]:
    outcome = run.program.call(run.write("a", b"stale", expected_revision=1))
    return expect(outcome, "CONFLICT") + stored_problems(run, "a", (2, PAYLOAD_2))


def delete_case(run: Run) -> list[str]:
    call = run.call(
        "delete",
        scope=run.scope,
        object_id="a",
        expected_revision=2,
        idempotency_key=f"d-{os.urandom(8).hex()}",
    )
    outcome = run.program.call(call)
    problems = expect(outcome, "OK")
    if not problems:
        problems += same(outcome.result, {"object_id": "a", "revision": 2}, "result")
    return problems + stored_problems(run, "a", None)


def not_found_case(run: Run) -> list[str]:
    delete = run.call(
        "delete",
        scope=run.scope,
        object_id="a",
        expected_revision=0,
        idempotency_key=f"d-{os.urandom(8).hex()}",
    )
    read, again = run.program.calls([run.read("a", "primary"), delete])
    return expect(read, "NOT_FOUND", what="read") + expect(again, "NOT_FOUND", what="delete")


# Many records --------------------------------------------------------------------------------


def _write_all(run: Run, payloads: dict[str, bytes]) -> list[str]:
    outcomes = run.program.calls([run.write(oid, data) for oid, data in payloads.items()])
    return [
        problem
        for oid, outcome in zip(payloads, outcomes, strict=True)
        for problem in expect(outcome, "OK", what=f"writing {oid!r}")
    ]


def list_case(run: Run) -> list[str]:
    scope = f"{run.scope}-list"
    payloads = {f"l{n}": f"listed {n}".encode() for n in range(LIST_RECORDS)}
    calls = [
        run.call("write", scope=scope, object_id=oid, payload_b64=b64(data),
                 expected_revision=0, idempotency_key=f"l-{os.urandom(8).hex()}")
        for oid, data in payloads.items()
    ]  # fmt: skip
    problems = [
        problem
        for outcome in run.program.calls(calls)
        for problem in expect(outcome, "OK", what="writing a record to list")
    ]
    if problems:
        return problems
    seen: list[tuple[str, str]] = []
    cursor = ""
    for _ in range(LIST_RECORDS + 2):
        outcome = run.program.call(run.call("list", scope=scope, page_size=LIST_PAGE,
                                            cursor=cursor))  # fmt: skip
        if outcome.status != "OK":
            return expect(outcome, "OK", what="a page")
        page = outcome.result.get("records") or []
        if len(page) > LIST_PAGE:
            return [f"a page of {len(page)} records, asked for {LIST_PAGE}"]
        seen += [(r.get("object_id"), r.get("payload_b64")) for r in page]
        cursor = outcome.result.get("next_cursor") or ""
        if not cursor:
            break
    else:
        return ["the cursor never ran out"]
    wanted = [(oid, b64(payloads[oid])) for oid in sorted(payloads)]
    return same(seen, wanted, "records over the pages")


def read_many_case(run: Run) -> list[str]:
    payloads = {f"m{n}": f"many {n}".encode() for n in range(3)}
    problems = _write_all(run, payloads)
    if problems:
        return problems
    reads = [{"scope": run.scope, "object_id": oid, "mode": "primary"}
             for oid in [*payloads, "m-missing"]]  # fmt: skip
    outcome = run.program.call(run.call("read_many", reads=reads))
    if outcome.status != "OK":
        return expect(outcome, "OK")
    results = outcome.result.get("results") or []
    if len(results) != len(reads):
        return [f"expected {len(reads)} results, got {len(results)}"]
    for (oid, data), result in zip(payloads.items(), results, strict=False):
        problems += same(result.get("status"), "OK", f"{oid}'s status")
        record = result.get("record") or {}
        problems += same((record.get("object_id"), record.get("payload_b64")),
                         (oid, b64(data)), f"{oid}'s record")  # fmt: skip
    return problems + same(results[-1].get("status"), "NOT_FOUND", "the missing one's status")


# Idempotency ---------------------------------------------------------------------------------


def _retry_key(run: Run) -> str:
    # Outcomes are kept per caller and key across runs: the run's own key.
    return f"retry-{run.scope}"


def idempotent_retry_case(run: Run) -> list[str]:
    call = run.write("i", b"once", idempotency_key=_retry_key(run))
    first = run.program.call(call)
    second = run.program.call(call)
    problems = expect(first, "OK", what="first") + expect(second, "OK", what="second")
    if not problems:
        problems += same(second.result, first.result, "the retry's result")
    return problems + stored_problems(run, "i", (1, b"once"))


def key_reused_case(run: Run) -> list[str]:
    outcome = run.program.call(run.write("i", b"other", idempotency_key=_retry_key(run)))
    return expect(outcome, "CONFLICT") + stored_problems(run, "i", (1, b"once"))


# Requests the service must refuse ---------------------------------------------------------


def tampered_case(run: Run) -> list[str]:
    outcome = run.program.call(run.write("t-tampered", b"x", tamper="signature"))
    return expect(outcome, "UNAUTHENTICATED", "bad_signature") + stored_problems(
        run, "t-tampered", None
    )


def unsigned_case(run: Run) -> list[str]:
    outcome = run.program.call(run.write("t-unsigned", b"x", tamper="unsigned"))
    return expect(outcome, "UNAUTHENTICATED", "unsigned") + stored_problems(run, "t-unsigned", None)


def replayed_case(run: Run) -> list[str]:
    before = run.fleet.rejections("replayed")
    outcome = run.program.call(
        run.write("t-replayed", b"once", tamper="replay", timeout_ms=REPLAY_TIMEOUT_MS)
    )
    problems = expect(outcome, "OK", what="the first copy")
    replay = outcome.replay or {}
    problems += same(replay.get("status"), NO_ANSWER, "the copy sent again")
    counted = _settled(lambda: run.fleet.rejections("replayed") - before, lambda n: n >= 1)
    problems += same(counted, 1, "the workers' replayed refusals")
    return problems + stored_problems(run, "t-replayed", (1, b"once"))


def expired_case(run: Run) -> list[str]:
    started = time.monotonic()
    outcome = run.program.call(run.write("t-expired", b"x", timeout_ms=1))
    took_s = time.monotonic() - started
    problems = []
    if outcome.status != NO_ANSWER:
        problems += expect(outcome, "RESOURCE_EXHAUSTED", "queue_too_long")
        if problems:
            problems = [f"expected {NO_ANSWER} or RESOURCE_EXHAUSTED (queue_too_long), "
                        f"got {outcome.describe()}"]  # fmt: skip
    if took_s > 1.0:
        problems.append(f"the call ended {took_s:.1f} s after it was asked, past a second")
    time.sleep(SETTLE_S / 4)
    return problems + stored_problems(run, "t-expired", None)


def rate_limited_case(run: Run) -> list[str]:
    calls = [run.read("t-paced", key=run.paced, retry=False) for _ in range(2)]
    outcomes = run.program.calls(calls)
    refused = [o for o in outcomes if o.status == "RESOURCE_EXHAUSTED"]
    answered = [o for o in outcomes if o.status == "NOT_FOUND"]
    if len(refused) != 1 or len(answered) != 1:
        got = ", ".join(o.describe() for o in outcomes)
        return [f"expected one NOT_FOUND and one RESOURCE_EXHAUSTED (rate_limited), got {got}"]
    problems = same(refused[0].reason, "rate_limited", "the refusal's reason")
    most_ms = 1000 / PACED_RATE_PER_S
    if not 0 < refused[0].retry_after_ms <= most_ms:
        problems.append(
            f"retry_after_ms {refused[0].retry_after_ms}: expected within (0, {most_ms:.0f}]"
        )
    return problems


# Many operations at once -------------------------------------------------------------------


def batch_case(run: Run) -> list[str]:
    payloads = {f"b{n:02d}": f"batched {n}".encode() for n in range(BATCH_WRITES)}
    operations = [
        {"op": "write", "scope": run.scope, "object_id": oid, "payload_b64": b64(data),
         "expected_revision": 0, "idempotency_key": f"b-{os.urandom(8).hex()}"}
        for oid, data in payloads.items()
    ]  # fmt: skip
    operations.append(
        {"op": "write", "scope": run.scope, "object_id": "b-never", "payload_b64": b64(b"x"),
         "expected_revision": 7, "idempotency_key": f"b-{os.urandom(8).hex()}"}
    )  # fmt: skip
    outcome = run.program.call(
        run.call("batch", lane="batch", timeout_ms=BATCH_TIMEOUT_MS, operations=operations)
    )
    if outcome.status != "OK":
        return expect(outcome, "OK")
    answers = outcome.result.get("answers") or []
    if len(answers) != len(operations):
        return [f"expected {len(operations)} answers, got {len(answers)}"]
    statuses = [answer.get("status") for answer in answers]
    problems = same(statuses, ["OK"] * BATCH_WRITES + ["CONFLICT"], "the answers' statuses")
    stored = run.stored()
    held = {oid: stored.get(oid) for oid in [*payloads, "b-never"]}
    wanted = {**{oid: (1, data) for oid, data in payloads.items()}, "b-never": None}
    return problems + same(held, wanted, "the database's records")


def reply_channel_case(run: Run) -> list[str]:
    payloads = {f"c{n:02d}": f"channelled {n}".encode() for n in range(CHANNEL_READS)}
    problems = _write_all(run, payloads)
    if problems:
        return problems
    reads = [run.read(oid, "primary", reply_channel=True) for oid in payloads]
    with run.fleet.reply_pushes(CALLER) as pushes:
        outcomes = run.program.calls(reads)
        # The last answer's push may reach the monitor just after the caller has it.
        _settled(lambda: sum(pushes.values()), lambda n: n >= CHANNEL_READS)
    for (oid, data), outcome in zip(payloads.items(), outcomes, strict=True):
        problems += expect(outcome, "OK", what=oid) or record_problems(outcome, oid, 1, data)
    channels = {outcome.reply_channel for outcome in outcomes}
    if "" in channels:
        problems.append("an answer came on no reply channel")
    pushed = sum(pushes[channel] for channel in channels if channel)
    return problems + same(pushed, CHANNEL_READS, "answers the workers pushed to those channels")


def _settled(read: Callable[[], int], done: Callable[[int], bool]) -> int:
    """``read()`` once ``done`` says so, or after :data:`SETTLE_S`."""
    deadline = time.monotonic() + SETTLE_S
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


CASES: Sequence[Case] = (
    Case("write", write_case),
    Case("read-primary", read_primary_case),
    Case("read-cached", read_cached_case),
    Case("update", update_case),
    Case("conflict", conflict_case),
    Case("delete", delete_case),
    Case("not-found", not_found_case),
    Case("list", list_case),
    Case("read-many", read_many_case),
    Case("idempotent-retry", idempotent_retry_case),
    Case("key-reused", key_reused_case),
    Case("tampered", tampered_case),
    Case("unsigned", unsigned_case),
    Case("replayed", replayed_case),
    Case("expired", expired_case),
    Case("rate-limited", rate_limited_case),
    Case("batch", batch_case),
    Case("reply-channel", reply_channel_case),
)

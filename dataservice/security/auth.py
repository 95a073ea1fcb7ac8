"""Who is asking, and may they: request signatures and the callers' allowlists.

A caller signs the exact bytes of its encoded ``RequestEnvelope`` with
HMAC-SHA256 under one of its keys, and sends both in a ``SignedRequest`` (see
``access.proto``). The worker verifies the signature over those bytes before
it parses them, so nothing a forger wrote is ever interpreted.

Why HMAC rather than Celery's message signing: Celery's ``auth`` serializer
signs with one X.509 identity per worker configuration, replaces the task
serializer (ours is the protobuf envelope itself), and costs a public-key
signature per message. The service needs a per-caller identity that it maps
to an allowlist, verified in microseconds, and a signature that travels inside
the envelope whatever carries it. A shared-secret MAC gives exactly that; its
cost is that the service holds every caller's secret, which it must anyway to
tell callers apart.

:meth:`Authenticator.open` returns a verified envelope and
:meth:`Authenticator.authorise` the caller's policy for it; both raise
:class:`~dataservice.refusals.Rejected`, which names the reason (for the
rejection counters) and what the caller is told.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from dataservice.codec import decode_request
from dataservice.config.model import CallerPolicy, Config, LaneConfig
from dataservice.enums import LaneName
from dataservice.errors import InvalidArgument
from dataservice.identifiers import CALLER_RE
from dataservice.proto import pb
from dataservice.refusals import Reason, Rejected
from dataservice.security.callers import CallerKey, KeyRing

# Key id, signature and field framing around the envelope.
SIGNED_OVERHEAD = 256


def sign(envelope: bytes, key: CallerKey) -> bytes:
    """The ``SignedRequest`` bytes a caller publishes for an encoded envelope."""
    signature = hmac.new(key.secret.value, envelope, hashlib.sha256).digest()
    return pb.SignedRequest(
        envelope=envelope, key_id=key.key_id, signature=signature
    ).SerializeToString()


@dataclass(frozen=True, slots=True)
class Authorised:
    """A verified envelope whose caller may do what it asks, and that caller's policy."""

    envelope: pb.RequestEnvelope
    policy: CallerPolicy
    operation: str


def _bytes(body: object) -> bytes:
    return body if isinstance(body, bytes) else b""


def _claimed_caller(envelope: bytes, task_id: str) -> str:
    """The caller an unverified envelope names, if it is well formed and its
    request id is the message's: where to send an UNAUTHENTICATED answer."""
    try:
        claim = pb.RequestEnvelope.FromString(envelope)
    except (DecodeError, ValueError, RecursionError):
        return ""
    if claim.request_id != task_id or not CALLER_RE.fullmatch(claim.caller):
        return ""
    return claim.caller


def allow_operation(policy: CallerPolicy, caller: str, operation: str, scope: str) -> None:
    """Raise :class:`Rejected` unless ``policy`` lets its caller do ``operation``
    on ``scope`` (one operation of a batch: the lane was checked with the batch)."""
    if operation not in policy.operations:
        raise Rejected(Reason.OPERATION_DENIED, f"the caller may not {operation}", caller=caller)
    allow_scope(policy, caller, scope)


def allow_scope(policy: CallerPolicy, caller: str, scope: str) -> None:
    if not policy.allows_scope(scope):
        raise Rejected(
            Reason.SCOPE_DENIED, f"the caller may not use scope {scope!r}", caller=caller
        )


class Authenticator:
    """Verifies and authorises the requests arriving on one lane."""

    def __init__(self, keyring: KeyRing, config: Config, lane: LaneName) -> None:
        self._keyring = keyring
        self._config = config
        self._lane = lane
        self._lane_config: LaneConfig = config.lanes[lane]
        self._skew_ms = config.auth.max_clock_skew_ms
        # A batch message may be larger than one request (lanes.<lane>.max_message_bytes).
        self._envelope_bytes = config.message_bytes(self._lane_config)
        self._max_ops = self._lane_config.max_ops_per_message
        self._max_bytes = self._envelope_bytes + SIGNED_OVERHEAD

    def open(self, task_id: str, body: object, now_ms: int) -> pb.RequestEnvelope:
        """The verified and validated envelope of a message.

        Raises :class:`Rejected`. Checks, in order: shape and size, signature,
        envelope fields and clock. A request that is merely late is not
        rejected here: the caller of this method drops it, then asks
        :meth:`authorise`.
        """
        signed = self._parse(body)
        if not signed.signature and not signed.key_id:
            # Likely a bare RequestEnvelope (its fields parse as unknown ones).
            raise Rejected(
                Reason.UNSIGNED,
                "the request is not signed",
                caller=_claimed_caller(signed.envelope or _bytes(body), task_id),
            )
        key = self._keyring.verifying_key(signed.key_id)
        if key is None:
            raise Rejected(
                Reason.UNKNOWN_KEY,
                "unknown signing key",
                caller=_claimed_caller(signed.envelope, task_id),
            )
        expected = hmac.new(key.secret.value, signed.envelope, hashlib.sha256).digest()
        if not hmac.compare_digest(expected, signed.signature):
            raise Rejected(
                Reason.BAD_SIGNATURE,
                "the signature does not match the request",
                caller=_claimed_caller(signed.envelope, task_id),
            )
        # From here on the bytes are the caller's own.
        try:
            envelope = decode_request(
                signed.envelope,
                self._config.limits,
                max_bytes=self._envelope_bytes,
                max_ops=self._max_ops,
            )
            if envelope.request_id != task_id:
                raise InvalidArgument("request_id does not match the message id")
        except InvalidArgument as exc:
            raise Rejected(Reason.MALFORMED, exc.message, caller=key.caller) from None
        if envelope.caller != key.caller:
            raise Rejected(
                Reason.WRONG_CALLER,
                "the signing key belongs to another caller",
                caller=key.caller,
            )
        self._check_clock(envelope, now_ms)
        return envelope

    def _parse(self, body: object) -> pb.SignedRequest:
        if not isinstance(body, bytes):
            raise Rejected(
                Reason.MALFORMED,
                "the request body must be a protobuf SignedRequest",
            )
        if len(body) > self._max_bytes:
            raise Rejected(
                Reason.MALFORMED,
                f"request is {len(body)} bytes; the limit is {self._max_bytes}",
            )
        try:
            return pb.SignedRequest.FromString(body)
        except (DecodeError, ValueError, RecursionError):
            raise Rejected(
                Reason.MALFORMED, "request is not a valid access.v2.SignedRequest"
            ) from None

    def _check_clock(self, envelope: pb.RequestEnvelope, now_ms: int) -> None:
        caller = envelope.caller
        issued = envelope.issued_at_unix_ms
        if issued > now_ms + self._skew_ms:
            raise Rejected(
                Reason.CLOCK_SKEW,
                "the request is signed in the future; check the caller's clock",
                caller=caller,
            )
        longest = self._lane_config.max_deadline_ms
        if envelope.deadline_unix_ms > issued + longest + self._skew_ms:
            raise Rejected(
                Reason.MALFORMED,
                f"the deadline is more than this lane's {longest} ms after issue",
                caller=caller,
            )

    def authorise(self, envelope: pb.RequestEnvelope) -> Authorised:
        """The caller's policy for a verified envelope, if it allows the request."""
        caller = envelope.caller
        policy = self._config.callers.get(caller)
        if policy is None:
            raise Rejected(
                Reason.UNKNOWN_CALLER,
                "the caller has no permissions here",
                caller=caller,
            )
        operation = envelope.WhichOneof("operation")
        if operation == "batch":
            # Each operation is authorised on its own, as the envelope it would
            # have had alone (dataservice.handler.batch), so that one the caller
            # may not do fails alone.
            self._lane_allowed(policy, caller)
            return Authorised(envelope, policy, operation)
        if operation == "read_many":
            # The allowlist's "read"; each read's scope is authorised on its
            # own before any lookup (dataservice.handler.readmany), so that one
            # the caller may not read fails alone.
            if "read" not in policy.operations:
                raise Rejected(Reason.OPERATION_DENIED, "the caller may not read", caller=caller)
            self._lane_allowed(policy, caller)
            return Authorised(envelope, policy, operation)
        if operation is None or operation not in policy.operations:
            raise Rejected(
                Reason.OPERATION_DENIED,
                f"the caller may not {operation}",
                caller=caller,
            )
        self._lane_allowed(policy, caller)
        allow_scope(policy, caller, getattr(envelope, operation).scope)
        return Authorised(envelope, policy, operation)

    def _lane_allowed(self, policy: CallerPolicy, caller: str) -> None:
        if self._lane.value not in policy.lanes:
            raise Rejected(
                Reason.LANE_DENIED,
                f"the caller may not use the {self._lane.value} lane",
                caller=caller,
            )

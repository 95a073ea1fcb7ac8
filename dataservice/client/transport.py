"""The client's side of the wire: publish an envelope to a lane, await its answer.

Celery is used only to publish (so messages follow Celery's protocol and any
Celery tooling can read them); answers come back through
:class:`~dataservice.results.ResultStore`. No Celery type leaves this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kombu.exceptions import OperationalError as BrokerError

from dataservice.broker import SERIALIZER, TASK_NAME, celery_app
from dataservice.config import Config
from dataservice.enums import LaneName
from dataservice.errors import ResourceExhausted, Unavailable
from dataservice.limits.admission import (
    CALLER_HEADER,
    DEADLINE_HEADER,
    AdmissionRefused,
    take_refusal,
)
from dataservice.refusals import LIMIT_MESSAGES, Reason
from dataservice.results import ResultStore
from dataservice.settings import Settings

RETRY_BROKER_DOWN_S = 0.5


def refused(refusal: AdmissionRefused, accepted: tuple[object, ...] = ()) -> ResourceExhausted:
    """The caller's error for an admission refusal (``accepted``: what went before it)."""
    rate = refusal.reason is Reason.RATE_LIMITED
    return ResourceExhausted(
        LIMIT_MESSAGES[refusal.reason] + ("; not queued" if rate else "; retry later"),
        retry_after=refusal.retry_after_ms / 1000,
        reason=refusal.reason,
        accepted=accepted,
    )


class Transport:
    def __init__(self, settings: Settings, config: Config, *, max_waiters: int = 64) -> None:
        self.config = config
        self._app = celery_app("dataservice-client", settings, config)
        # Publishing must never hang a caller past its deadline on a dead broker.
        self._app.conf.broker_connection_timeout = 2
        self._app.conf.broker_connection_max_retries = 0
        self.results = ResultStore.from_url(
            settings.result_backend_url,
            max_waiters=max_waiters,
        )

    def _options(
        self, request_id: str, lane: LaneName, deadline_ms: int, size: int, caller: str
    ) -> dict[str, Any]:
        headers: dict[str, Any] = {DEADLINE_HEADER: deadline_ms}
        if caller:
            headers[CALLER_HEADER] = caller
        return {
            "task_id": request_id,
            "queue": self.config.lanes[lane].queue,
            "serializer": SERIALIZER,
            "headers": headers,
            "ignore_result": True,
            # Celery would otherwise put repr(args) (the payload) into the
            # headers, where monitoring tools display it.
            "argsrepr": f"<RequestEnvelope {size} bytes>",
            "kwargsrepr": "{}",
        }

    def publish(
        self, body: bytes, *, request_id: str, lane: LaneName, deadline_ms: int, caller: str = ""
    ) -> None:
        self.publish_many([(body, request_id, deadline_ms)], lane=lane, caller=caller)

    def publish_many(
        self, items: Iterable[tuple[bytes, str, int]], *, lane: LaneName, caller: str = ""
    ) -> int:
        """Publish in order; returns how many were sent. A refusal raises
        :class:`AdmissionRefused` (its ``sent``: how many went before it).
        ``caller`` (when given) holds the messages to that caller's rate at
        admission, as the workers will."""
        sent = 0
        refusal = take_refusal()  # nothing stale from an earlier publish on this thread
        try:
            with self._app.producer_or_acquire() as producer:
                for body, request_id, deadline_ms in items:
                    self._app.send_task(
                        TASK_NAME,
                        args=(body,),
                        producer=producer,
                        **self._options(request_id, lane, deadline_ms, len(body), caller),
                    )
                    refusal = take_refusal()
                    if refusal is not None:
                        # Raised once the producer is back in its pool: an
                        # exception inside would make kombu discard it.
                        break
                    sent += 1
        except BrokerError:
            raise Unavailable(
                "the broker is unreachable", retry_after=RETRY_BROKER_DOWN_S
            ) from None
        if refusal is not None:
            refusal.sent = sent
            raise refusal
        return sent

    def close(self) -> None:
        self.results.close()
        self._app.close()

"""How requests and answers travel: Celery and kombu on Redis or RabbitMQ, the
result backend.

- :mod:`.base`: what the service needs of a broker (:class:`Broker`);
  :mod:`.redis` and :mod:`.rabbitmq`, one implementation each, chosen once by
  :func:`broker_for`.
- :mod:`.celery`: the task, its serializer and the Celery settings.
- :mod:`.results`: the answers' store.
"""

from dataservice.broker.base import Broker, Peek, QueueDepths
from dataservice.broker.rabbitmq import RabbitBroker
from dataservice.broker.redis import REDIS_SCHEMES, RedisBroker
from dataservice.config.settings import AMQP_SCHEMES, Settings
from dataservice.errors import InvalidArgument

__all__ = ["Broker", "Peek", "QueueDepths", "broker_for", "queue_depths"]


def broker_for(settings: Settings) -> Broker:
    """The broker at ``settings.broker_url``: RabbitMQ for ``amqp://`` and
    ``amqps://``, else Redis (``redis://``, ``rediss://``, ``unix://``,
    ``sentinel://``, ``sentinels://``)."""
    if settings.broker_url.startswith(AMQP_SCHEMES):
        return RabbitBroker(settings)
    if settings.broker_url.startswith(REDIS_SCHEMES):
        return RedisBroker(settings)
    raise InvalidArgument(
        "the broker URL must be redis://, rediss://, unix://, sentinel://, sentinels:// (Redis) "
        "or amqp://, amqps:// (RabbitMQ)"
    )


def queue_depths(settings: Settings) -> QueueDepths:
    """Counts of what waits in each queue on the service's broker (connects on first use)."""
    return broker_for(settings).depths()

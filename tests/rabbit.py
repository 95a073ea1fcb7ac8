"""RabbitMQ for the tests: a virtual host of their own, made afresh."""

from __future__ import annotations

import subprocess

# The Redis of the answers, the limits and admission's books when RabbitMQ is the broker.
AMQP_REDIS_URL = "redis://127.0.0.1:6379/13"


def fresh_vhost(name: str) -> str:
    """An empty virtual host ``name`` (deleted first, with its queues), open
    to the guest user; its ``amqp://`` URL."""
    subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], check=False, capture_output=True)
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", name], check=True, capture_output=True)
    subprocess.run(
        ["rabbitmqctl", "-q", "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
        check=True,
        capture_output=True,
    )
    return f"amqp://guest:guest@127.0.0.1:5672/{name}"

"""Local Redis, MariaDB and RabbitMQ for development, tests and the demo.

``python -m dataservice_tools.localservices up`` makes sure the Redis and MariaDB
named by the ``DATASERVICE_*`` URLs answer, and RabbitMQ with its management
API (the broker's URL when it is ``amqp://``, else :data:`.rabbitmq.LOCAL_AMQP`,
which the tests, benchmarks and ``dataservice loadtest`` use: there, one that
cannot be had is a warning); when one does not and its URL
points at this machine, a private instance is started from the installed
binaries with its data in a state directory (``.state/`` in the working
directory, or ``--state-dir``), and keeps running until
``python -m dataservice_tools.localservices down``.

:class:`PrivateMariaDB` also starts a throw-away MariaDB with a ROW-format
binary log on a free port, for tests and demos that read the change stream.

Modules: :mod:`.probes` (is it answering, where is the binary),
:mod:`.mariadb` (a server of our own), :mod:`.redisserver` (a Redis of our
own), :mod:`.rabbitmqserver` (a RabbitMQ node of our own), :mod:`.rabbitmq`
(virtual hosts on the local RabbitMQ), :mod:`.lifecycle` (``up`` and ``down``),
:mod:`.binlog` (a server with a binlog where the configured one has none) and
``__main__`` (the command).
"""

from dataservice_tools.localservices.lifecycle import DEFAULT_STATE_DIR, down, start_redis, up
from dataservice_tools.localservices.mariadb import (
    PrivateMariaDB,
    TemporaryBinlogMariaDB,
    mariadb_dir,
)
from dataservice_tools.localservices.probes import free_port, mysql_reachable, redis_reachable
from dataservice_tools.localservices.rabbitmqserver import (
    amqp_reachable,
    ensure_management,
    rabbitmq_dir,
)
from dataservice_tools.localservices.redisserver import PrivateRedis

__all__ = [
    "DEFAULT_STATE_DIR",
    "PrivateMariaDB",
    "PrivateRedis",
    "TemporaryBinlogMariaDB",
    "amqp_reachable",
    "down",
    "ensure_management",
    "free_port",
    "mariadb_dir",
    "mysql_reachable",
    "rabbitmq_dir",
    "redis_reachable",
    "start_redis",
    "up",
]

"""RabbitMQ on this machine, for tests, benchmarks and the demo: virtual
hosts of their own, open to the default ``guest`` user, made with
``rabbitmqctl`` (which needs the node's Erlang cookie: run as root or as the
``rabbitmq`` user)."""

from __future__ import annotations

import shutil
import subprocess

from dataservice.errors import ServiceSetupError

LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672/"
_CTL_TIMEOUT_S = 60


def _ctl(*args: str, check: bool = True) -> None:
    binary = shutil.which("rabbitmqctl")
    if binary is None:
        raise ServiceSetupError("rabbitmqctl is not installed (Debian: rabbitmq-server)")
    done = subprocess.run(
        [binary, "-q", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=_CTL_TIMEOUT_S,
    )
    if check and done.returncode != 0:
        raise ServiceSetupError(f"rabbitmqctl {args[0]} failed: {done.stderr.strip()}")


def virtual_host(name: str, *, fresh: bool = False) -> str:
    """The ``amqp://`` URL of virtual host ``name`` on the local RabbitMQ, made
    if missing (``fresh``: deleted first, with every queue in it)."""
    if fresh:
        _ctl("delete_vhost", name, check=False)
    _ctl("add_vhost", name, check=False)
    _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    return LOCAL_AMQP + name


def delete_virtual_host(name: str) -> None:
    """Delete virtual host ``name`` on the local RabbitMQ, with every queue in
    it (nothing when it is not there)."""
    _ctl("delete_vhost", name, check=False)

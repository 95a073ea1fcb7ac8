"""A RabbitMQ node of our own, from Debian's rabbitmq-server, with its data in
the state directory: what ``up`` starts where the RabbitMQ the project uses
does not answer."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from dataservice.broker.rabbitmq import unreachable, where
from dataservice.errors import ServiceSetupError
from dataservice_tools.localservices.probes import (
    binary,
    free_port,
    is_local,
    server_dir,
    wait_until,
)

# Debian's script itself: its /usr/sbin wrapper runs it through `su` in the
# system node's directory, with the system node's startup log.
SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
USER = "rabbitmq"
DEFAULT_PORT = 5672
# Flower reads RabbitMQ's queues from its management API, on the broker's host at this port.
MANAGEMENT_PORT = 15672
PROBE_TIMEOUT_S = 1.0
_NOT_INSTALLED = "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)"


def rabbitmq_dir(state_dir: Path) -> Path:
    """Where ``up`` keeps its RabbitMQ (as root, the node runs as ``rabbitmq``)."""
    return server_dir(state_dir, "rabbitmq")


def guest_url(port: int) -> str:
    """The default virtual host as the default user, who may connect from this machine."""
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def amqp_reachable(url: str) -> bool:
    return not unreachable(url, PROBE_TIMEOUT_S)


def ensure_rabbitmq(url: str, state_dir: Path) -> int | None:
    """Make the RabbitMQ at ``url`` answer, starting a node of our own where
    nothing listens and the URL names this machine; the port of the node
    started, None if one already answered."""
    parsed = urlsplit(url)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or (5671 if parsed.scheme == "amqps" else DEFAULT_PORT)
    # TCP first: where nothing listens, kombu takes 2 s to say so.
    if _listening(host, port):
        why = unreachable(url, PROBE_TIMEOUT_S)
        if why:
            # A missing virtual host, a wrong password: a second node could not have its port.
            raise ServiceSetupError(f"{where(url)} does not accept the connection ({why})")
        return None
    # A node of ours would not speak TLS.
    if not is_local(parsed.hostname) or parsed.scheme != "amqp":
        raise ServiceSetupError(f"{where(url)} is unreachable")
    start_rabbitmq(state_dir, port)
    why = unreachable(url, PROBE_TIMEOUT_S)
    if why:
        raise ServiceSetupError(
            f"RabbitMQ started on port {port}, but {where(url)} does not accept the connection "
            f"({why})"
        )
    return port


def ensure_management(url: str) -> bool:
    """Make RabbitMQ's management API answer on the broker's host (Flower reads
    the queues' lengths there), turning the plugin on in the node at ``url``
    when it is on this machine; True if it was turned on now."""
    host = urlsplit(url).hostname or "127.0.0.1"
    if _listening(host, MANAGEMENT_PORT):
        return False
    if not is_local(host):
        raise ServiceSetupError(
            f"{where(url)}: its management API does not answer on port {MANAGEMENT_PORT}, "
            "so Flower shows no queue lengths (rabbitmq-plugins enable rabbitmq_management)"
        )
    # The node's own list of plugins, changed for good: this node is not ours.
    done = subprocess.run(
        [binary("rabbitmq-plugins"), "-q", "enable", "rabbitmq_management"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise ServiceSetupError(f"rabbitmq-plugins enable rabbitmq_management failed: {said}")
    wait_until(lambda: _listening(host, MANAGEMENT_PORT), "RabbitMQ's management API")
    return True


def start_rabbitmq(state_dir: Path, port: int) -> None:
    """Start a detached RabbitMQ node on 127.0.0.1:``port``, its data, log
    and pid file in :func:`rabbitmq_dir`.

    On the default port it stands in for the system's node: it takes the node
    name that the system's ``rabbitmqctl`` talks to (``virtual_host()`` adds
    the tests' virtual hosts with it) and serves the management API on its
    usual port. On any other port its name is its own, it runs no plugin, and
    it never clashes with the system node."""
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        raise ServiceSetupError(_NOT_INSTALLED) from None
    if not SERVER.exists():
        raise ServiceSetupError(_NOT_INSTALLED)
    if os.geteuid() == 0:
        as_user = [binary("runuser"), "-u", USER, "--"]
    elif os.geteuid() == user.pw_uid:
        as_user = []
    else:
        # The node must share the system one's Erlang cookie, readable only by rabbitmq.
        raise ServiceSetupError(
            f"nothing answers AMQP on port {port}, and only root or the {USER} user "
            "can start a RabbitMQ there"
        )
    directory = rabbitmq_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    # Our own files, not /etc/rabbitmq's: the system node's listener is on 5672.
    config = directory / "rabbitmq.conf"
    # The management API where Flower looks for it, on the default port only:
    # elsewhere nothing would find it, and it triples the time a node takes
    # to stop.
    listeners = f"listeners.tcp.local = 127.0.0.1:{port}\n"
    if port == DEFAULT_PORT:
        listeners += f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {MANAGEMENT_PORT}\n"
    config.write_text(listeners)
    plugins = directory / "enabled_plugins"
    plugins.write_text("[rabbitmq_management].\n" if port == DEFAULT_PORT else "[].\n")
    if os.geteuid() == 0:
        for path in (directory, config, plugins):
            shutil.chown(path, USER, USER)
    log = directory / "rabbitmq.log"
    env = {
        # Its Erlang cookie, the one the system's rabbitmqctl presents.
        "HOME": user.pw_dir,
        "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
        "RABBITMQ_LOG_BASE": str(directory),
        "RABBITMQ_LOGS": str(log),
        "RABBITMQ_PID_FILE": str(directory / "rabbitmq.pid"),
        "RABBITMQ_CONFIG_FILE": str(config),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
        "RABBITMQ_NODE_PORT": str(port),
        # Not port + 20000, the default: that may be taken, or past 65535.
        "RABBITMQ_DIST_PORT": str(free_port()),
    }
    if port != DEFAULT_PORT:
        env["RABBITMQ_NODENAME"] = f"dataservice-{port}@localhost"
    done = subprocess.run(
        [*as_user, "env", *(f"{k}={v}" for k, v in env.items()), str(SERVER), "-detached"],
        cwd=directory,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise ServiceSetupError(f"rabbitmq-server failed to start: {said}")
    wait_until(
        lambda: _listening("127.0.0.1", port) and amqp_reachable(guest_url(port)), "rabbitmq", log
    )


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True

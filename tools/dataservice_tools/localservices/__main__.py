"""``python -m dataservice_tools.localservices up|down|cells [--state-dir DIR]
[--binlog-port PORT]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError
from dataservice.security.callers import ensure_callers_file
from dataservice_tools.localservices.binlog import ensure_binlog
from dataservice_tools.localservices.cells import cells_down, cells_up
from dataservice_tools.localservices.flower_env import USER, ensure_flower_env
from dataservice_tools.localservices.lifecycle import DEFAULT_STATE_DIR, down, ensure_amqp, up
from dataservice_tools.localservices.rabbitmq import LOCAL_AMQP


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataservice_tools.localservices")
    parser.add_argument("action", choices=["up", "down", "cells"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    # Where a private binlog MariaDB listens when the configured one has no binlog
    # (default: where it did before, else 3307, else a free port).
    parser.add_argument("--binlog-port", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            settings = Settings.from_env()
            done = up(settings, args.state_dir)
            if not settings.broker_is_amqp:
                done += _local_rabbitmq(args.state_dir)
            print("started: " + ", ".join(done) if done else "redis, mariadb and rabbitmq answer")
            config = settings.load()
            binlog = ensure_binlog(settings, config.database, args.state_dir, args.binlog_port)
            if binlog is not None:
                started = " (started)" if binlog.started else ""
                print(
                    "the configured mariadb has no binlog: run and demo use the one on port "
                    f"{binlog.port}{started}, as {binlog.env_file} says"
                )
            flower = ensure_flower_env(args.state_dir)
            if flower is not None:
                print(f"Flower's credentials (user {USER}): {flower}")
            added = ensure_callers_file(settings, config)
            if added:
                print(f"{settings.callers_file}: new keys for {', '.join(added)}")
            # Imported here: the ACL rules need the configuration, the rest of this module not.
            from dataservice.security.acl import apply_from_settings

            users = apply_from_settings(settings)
            if users:
                print("redis users: " + ", ".join(users))
        elif args.action == "cells":
            cells_file, fresh = cells_up(args.state_dir)
            print(("started" if fresh else "running") + f": three cells' Redis; {cells_file}")
            print(
                "name them in queues.yml (cells.names: [a, b, c]) and set "
                f"DATASERVICE_CELLS_FILE={cells_file}"
            )
        else:
            done = down(args.state_dir) + cells_down(args.state_dir)
            print("stopped: " + (", ".join(done) or "nothing"))
    except DataServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _local_rabbitmq(state_dir: Path) -> list[str]:
    """The local RabbitMQ the tests, benchmarks and ``dataservice loadtest``
    use. The service on a Redis broker runs without it: where it cannot be
    had, a warning, not an error."""
    try:
        return ensure_amqp(LOCAL_AMQP, state_dir)
    except DataServiceError as exc:
        print(f"warning: {exc} (only the tests and runs on RabbitMQ need it)", file=sys.stderr)
        return []


if __name__ == "__main__":
    sys.exit(main())

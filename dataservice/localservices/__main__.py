"""``python -m dataservice.localservices up|down [--state-dir DIR]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dataservice.callers import ensure_callers_file
from dataservice.errors import DataServiceError
from dataservice.localservices.lifecycle import DEFAULT_STATE_DIR, down, up
from dataservice.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataservice.localservices")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            settings = Settings.from_env()
            done = up(settings, args.state_dir)
            print("started: " + ", ".join(done) if done else "redis and mariadb are reachable")
            added = ensure_callers_file(settings, settings.load())
            if added:
                print(f"{settings.callers_file}: new keys for {', '.join(added)}")
            # Imported here: the ACL rules need the configuration, the rest of this module not.
            from dataservice.acl import apply_from_settings

            users = apply_from_settings(settings)
            if users:
                print("redis users: " + ", ".join(users))
        else:
            done = down(args.state_dir)
            print("stopped: " + (", ".join(done) or "nothing"))
    except DataServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

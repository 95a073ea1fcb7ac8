"""Flower's credentials for ``make run``: ``<state dir>/flower.env``.

``make services`` writes ``DATASERVICE_FLOWER_AUTH=ops:<random>`` there once
(mode 600) unless the environment already sets it, and keeps it after; the
Makefile reads the file before ``dataservice run``, which then starts Flower
with authentication on (``docs/operations.md``, "Flower").
"""

from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path

FLOWER_ENV = "flower.env"
VARIABLE = "DATASERVICE_FLOWER_AUTH"
USER = "ops"


def ensure_flower_env(state_dir: Path) -> Path | None:
    """The file, written when missing; None when the environment sets the variable."""
    if os.environ.get(VARIABLE):
        return None
    path = state_dir / FLOWER_ENV
    if path.exists():
        return path
    state_dir.mkdir(parents=True, exist_ok=True)
    # Created private, before the password is written into it.
    path.touch(mode=0o600)
    path.chmod(0o600)
    auth = f"{USER}:{secrets.token_urlsafe(18)}"
    path.write_text(
        "# Written by `make services`: Flower's basic authentication for `make run`.\n"
        f"{VARIABLE}={shlex.quote(auth)}\n",
        encoding="utf-8",
    )
    return path

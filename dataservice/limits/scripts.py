"""Lua scripts, loaded from their ``.lua`` files (the limits' here, the cache's
in :mod:`dataservice.cache`).

A line ``--#include <path>.lua`` in a script is replaced by that fragment, its
path taken from the ``dataservice`` package's root wherever the script lives
(``limits/gcra.lua``: one rate algorithm for every script that needs it;
``cache/forget.lua``: one invalidation for the workers and the change stream). A script
runs by EVALSHA, and by EVAL (which also loads it) the first time a server
lacks it.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

import redis
from redis.exceptions import NoScriptError

_INCLUDE = "--#include "
_ROOT = "dataservice"


def _text(package: str, name: str) -> str:
    return resources.files(package).joinpath(name).read_text("utf-8")


def compose(name: str, package: str = __package__) -> str:
    """The script in ``name`` (a file of ``package``) with its fragments included."""
    lines = []
    for line in _text(package, name).splitlines():
        if line.startswith(_INCLUDE):
            lines.append(_text(_ROOT, line.removeprefix(_INCLUDE).strip()))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


class LuaScript:
    """One script, runnable on any client of any server."""

    def __init__(self, name: str, package: str = __package__) -> None:
        self.name = name
        self.text = compose(name, package)
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.text, len(keys), *keys, *args)

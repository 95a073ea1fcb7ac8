"""Lua scripts, loaded from their ``.lua`` files (the limits' here, the cache's
in :mod:`dataservice.cache`).

A line ``--#include <name>.lua`` in a script is replaced by that fragment
(``gcra.lua``: one rate algorithm for every script that needs it). A script
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


def _text(package: str, name: str) -> str:
    return resources.files(package).joinpath(name).read_text("utf-8")


def compose(name: str, package: str = __package__) -> str:
    """The script in ``name`` (a file of ``package``) with its fragments included."""
    lines = []
    for line in _text(package, name).splitlines():
        if line.startswith(_INCLUDE):
            lines.append(_text(package, line.removeprefix(_INCLUDE).strip()))
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

    def many(self, client: redis.Redis, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run the script once per ``(keys, args)`` in one round trip. For
        idempotent scripts only: on a server that lacks the script, the calls
        that found it already ran are run again once it is loaded."""
        for attempt in range(2):
            with client.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.evalsha(self.sha, len(keys), *keys, *args)
                try:
                    return list(pipe.execute())
                except NoScriptError:
                    if attempt:
                        raise
                    client.script_load(self.text)
        raise AssertionError("unreachable")

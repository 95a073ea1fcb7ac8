"""Lua scripts, loaded from their ``.lua`` files in the package that runs them
(``limits/``, ``cache/``, ``changes/``, ``broker/``).

A line ``--#include <path>.lua`` in a script is replaced by that fragment, its
path taken from the ``dataservice`` package's root wherever the script lives
(``limits/gcra.lua``: one rate algorithm for every script that needs it;
``cache/forget.lua``: one invalidation for the workers and the change stream). A script
runs by EVALSHA, and by EVAL (which also loads it) the first time a server
lacks it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import NoScriptError

_INCLUDE = "--#include "
_ROOT = "dataservice"


def _text(package: str, name: str) -> str:
    return resources.files(package).joinpath(name).read_text("utf-8")


def compose(name: str, package: str) -> str:
    """The script in ``name`` (a file of ``package``) with its fragments
    included, and theirs (a fragment's path is from the package's root)."""
    return _included(_text(package, name)) + "\n"


def _included(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith(_INCLUDE):
            lines.append(_included(_text(_ROOT, line.removeprefix(_INCLUDE).strip())))
        else:
            lines.append(line)
    return "\n".join(lines)


class LuaScript:
    """One script, runnable on any client of any server."""

    def __init__(self, name: str, package: str) -> None:
        self.name = name
        self.text = compose(name, package)
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: list[str], args: list[Any]) -> Any:
        # The command itself, not redis-py's evalsha wrapper: a script runs on
        # every request, and the wrapper's argument checks cost a tenth as
        # much again as the command. (redis-py leaves execute_command untyped.)
        run = client.execute_command
        try:
            return run("EVALSHA", self.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
        except NoScriptError:
            return run("EVAL", self.text, len(keys), *keys, *args)  # type: ignore[no-untyped-call]

    async def run_async(self, client: AsyncRedis, keys: list[str], args: list[Any]) -> Any:
        """The same, on an asyncio client."""
        run = client.execute_command
        try:
            return await run("EVALSHA", self.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
        except NoScriptError:
            return await run("EVAL", self.text, len(keys), *keys, *args)  # type: ignore[no-untyped-call]


def run_pipelined(
    client: redis.Redis, calls: Sequence[tuple[LuaScript, list[str], list[Any]]]
) -> list[Any]:
    """Each ``(script, keys, args)`` in one round trip, in order; their results.

    A server that lacks a script answers its calls NOSCRIPT without running
    them: those alone are run again once it is loaded, so a script that is not
    idempotent still runs once. Any other error is raised."""
    results = _pipelined(client, calls)
    missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            client.script_load(script.text)
        for i, result in zip(missing, _pipelined(client, [calls[i] for i in missing]), strict=True):
            results[i] = result
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


async def run_pipelined_async(
    client: AsyncRedis, calls: Sequence[tuple[LuaScript, list[str], list[Any]]]
) -> list[Any]:
    """As :func:`run_pipelined`, on an asyncio client; each call's result or
    error (raised by none: the caller hands each its own)."""
    results = await _pipelined_async(client, calls)
    missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            await client.script_load(script.text)
        again = await _pipelined_async(client, [calls[i] for i in missing])
        for i, result in zip(missing, again, strict=True):
            results[i] = result
    return results


async def _pipelined_async(
    client: AsyncRedis, calls: Sequence[tuple[LuaScript, list[str], list[Any]]]
) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))


def _pipelined(
    client: redis.Redis, calls: Sequence[tuple[LuaScript, list[str], list[Any]]]
) -> list[Any]:
    with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return list(pipe.execute(raise_on_error=False))
